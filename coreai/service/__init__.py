"""The generation service: below the server's API dialects and the CLI, with no HTTP in it.

    request (GenerationRequest) --prepare--> job (GenerationJob) --Service.submit--> worker, engine
        --> Pieces and a result --ReplyEvents--> neutral events, ending with guided's Outcome

`request`: one generation in no front end's vocabulary; `prepare`: the one step to a complete job
(constraint, prompt, reasoning plan, sampling, budget cut at the context); `service.Service`: one
model's settings, grammars, worker and batch engine; `run`: a job alone on one model (the CLI,
`coreai.ConstrainedSession`); `events`: what every dialect renders.
"""

from coreai.service.events import Finish, ReplyEvents, decided, finish_of, job_events
from coreai.service.job import GenerationJob
from coreai.service.prepare import Settings, prepare
from coreai.service.request import GenerationRequest, Names, RequestError
from coreai.service.service import Service
from coreai.service.worker import Closed, Job, QueueFull

__all__ = [
    "Closed",
    "Finish",
    "GenerationJob",
    "GenerationRequest",
    "Job",
    "Names",
    "QueueFull",
    "ReplyEvents",
    "RequestError",
    "Service",
    "Settings",
    "decided",
    "finish_of",
    "job_events",
    "prepare",
]
