"""`coreai.service.events.whole_calls`: the one place a call's events are held until it is complete
(the Messages and Responses streams render what it yields)."""

from __future__ import annotations

import asyncio

from coreai.service.events import (
    CallArguments,
    CallDone,
    CallOpened,
    ContentDelta,
    ReasoningDelta,
    WholeCall,
    whole_calls,
)


async def _events(items):
    for item in items:
        yield item


def held(items) -> list:
    async def run():
        return [event async for event in whole_calls(_events(items))]

    return asyncio.run(run())


def test_a_complete_calls_fragments_come_together_once_it_is_closed():
    opened = CallOpened(0, "call_1", "get_weather")
    fragments = [CallArguments(0, '{"city": '), CallArguments(0, '"Paris"}')]
    out = held([ReasoningDelta("think"), ContentDelta("text"), opened, *fragments, CallDone(0, True)])
    assert out == [ReasoningDelta("think"), ContentDelta("text"), opened, WholeCall(opened, fragments)]


def test_a_call_the_budget_cut_yields_nothing_but_its_opening():
    first, cut = CallOpened(0, "a", "f"), CallOpened(1, "b", "g")
    out = held([first, CallArguments(0, "{}"), CallDone(0, True), cut, CallArguments(1, '{"x": 1'), CallDone(1, False)])
    assert out == [first, WholeCall(first, [CallArguments(0, "{}")]), cut]
    assert not [e for e in out if isinstance(e, CallArguments)]  # no fragment of either passes alone
