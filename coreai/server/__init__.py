"""llm-server: a local OpenAI-compatible HTTP server (FastAPI + uvicorn) whose `response_format`,
`structured_outputs` and `tools` are enforced by guided generation.

    from coreai.server import ServerConfig, create_app
    app = create_app(coreai.load(), ServerConfig(api_key="..."))
"""

from coreai.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
