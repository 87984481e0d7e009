"""The schema of a run directory's `plan.json`, for the boundary's readers (dlaunch/boundary.py).

`plan.json` holds the plan (what the script does) and the request (what the user asked for). Readers
that list runs need the plan's `scheduler` and `site`; `--resume` and `archive` need the whole request,
which is checked field by field against `LaunchRequest` (its model is derived from the dataclass, so
a field added there is checked here too). Strict: `gpus: "2"` is an error, not 2. Fields a newer
launcher adds to the plan are kept.
"""

import dataclasses
from typing import Annotated, Any, Dict, Type, get_type_hints

from pydantic import BaseModel, ConfigDict, StringConstraints, create_model, field_validator

from dlaunch.boundary import NAME
from dlaunch.jobs.request import LaunchRequest


class PlanPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    scheduler: str
    site: Annotated[str, StringConstraints(pattern="^%s$" % NAME)]

    @field_validator("scheduler")
    @classmethod
    def _known(cls, kind: str) -> str:
        from dlaunch.schedulers import SCHEDULERS

        if kind not in SCHEDULERS:
            raise ValueError("%r is not one of %s" % (kind, ", ".join(SCHEDULERS)))
        return kind


class PlanFile(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    plan: PlanPart
    request: Dict[str, Any]


def _request_model() -> Type[BaseModel]:
    """LaunchRequest's fields as a strict model of the JSON `LaunchRequest.to_dict` writes."""
    hints = get_type_hints(LaunchRequest)
    fields: Dict[str, Any] = {}
    for field in dataclasses.fields(LaunchRequest):
        if field.name == "trainer":  # a tuple of pairs in the dataclass, a table in the file
            fields[field.name] = (Dict[str, Any], {})
        else:
            fields[field.name] = (hints[field.name], field.default if field.default is not dataclasses.MISSING else ...)
    return create_model("StoredRequest", __config__=ConfigDict(extra="forbid", strict=True), **fields)


StoredRequest = _request_model()


def stored_request(data: Dict[str, Any], shown: str) -> LaunchRequest:
    """plan.json's request as a LaunchRequest; DlaunchError naming `shown` (the file) and the field."""
    from dlaunch.boundary import validate
    from dlaunch.errors import DlaunchError

    fields = validate(StoredRequest, data, shown + ": request").model_dump()
    try:
        return LaunchRequest.from_dict(fields)
    except DlaunchError as e:
        raise DlaunchError("%s: request: %s" % (shown, e)) from None
