"""The agent task benchmark (issue #59): small tasks, each in a fresh workspace with a checker, run
through Claude Code, Codex or opencode against `coreai serve` by `coreai launch`
(`python -m benchmarks.agent_tasks --client ...`; the tasks: `tasks.py`, the CLIs' transcripts:
`transcripts.py`)."""
