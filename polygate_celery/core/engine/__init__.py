"""Decision core: a governed call's decisions as a pure engine (SPEC §3).

`CallState` is one frozen record of a call; `next_action(state, event, now)`
returns the next state and the one `Action` a driver carries out (ask the store,
send, settle, wait, or end the call with a verdict), and the driver answers with
the `Event` it met. No I/O, no clock: every instant is passed in as `now`, on the
local monotonic clock (or an injected one); durations from the store's clock
(progress age) arrive as events and are only compared, never mixed with it.
"""

from polygate_celery.core.engine.actions import (
    Action,
    Admit,
    AskBreaker,
    AskProgress,
    Begin,
    BreakerState,
    Done,
    Event,
    Fail,
    GiveUp,
    Granted,
    ProgressAge,
    Record,
    Refused,
    Return,
    Send,
    Sent,
    Settle,
    Settled,
    Wait,
    Waited,
)
from polygate_celery.core.engine.rules import abandon_attempt, next_action, start
from polygate_celery.core.engine.state import (
    RATE_LIMIT_BLOCKS,
    CallRules,
    CallState,
    OutageCharge,
    Step,
    error_text,
    replace,
    same_source_worth_retrying,
)

__all__ = [
    "RATE_LIMIT_BLOCKS",
    "Action",
    "Admit",
    "AskBreaker",
    "AskProgress",
    "Begin",
    "BreakerState",
    "CallRules",
    "CallState",
    "Done",
    "Event",
    "Fail",
    "GiveUp",
    "Granted",
    "OutageCharge",
    "ProgressAge",
    "Record",
    "Refused",
    "Return",
    "Send",
    "Sent",
    "Settle",
    "Settled",
    "Step",
    "Wait",
    "Waited",
    "abandon_attempt",
    "error_text",
    "next_action",
    "replace",
    "same_source_worth_retrying",
    "start",
]
