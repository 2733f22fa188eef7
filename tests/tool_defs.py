"""Tool definitions shared by the tool-calling tests (OpenAI's chat shape)."""

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
UNIT = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
        },
    },
}
TOGGLE = {
    "type": "function",
    "function": {
        "name": "toggle",
        "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
    },
}


def track(session, ids: list[int]) -> tuple[list, list]:
    """Feed token ids one by one to a fresh call tracker of `session`, as the decode loop does:
    (the calls found, one channel label per token; a feed may relabel tokens it held)."""
    tracker = session.tracker()
    tracker.start = 0
    labels = []
    for t in ids:
        out = tracker.feed([t])
        labels[len(labels) - (len(out) - 1) :] = out
    calls = tracker.result(len(ids))[0]
    return calls, labels
