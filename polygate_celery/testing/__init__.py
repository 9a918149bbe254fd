"""Testing: a virtual clock and scripted sources, public so users can test their own governed code.

Run a gateway in virtual time::

    clock = VirtualClock()
    source = ScriptedSource(clock, [steps.server_error(), steps.ok("hi")])
    gateway = Gateway(config, {"primary": source}, clock=clock, random=lambda: 0.0)
    result = await gateway.call("summarise", payload)   # instant, deterministic
"""

from polygate_celery.testing import scripted as steps
from polygate_celery.testing.clock import VirtualClock
from polygate_celery.testing.scripted import ScriptedSource, ScriptExhausted, Sent, Step

__all__ = ["ScriptExhausted", "ScriptedSource", "Sent", "Step", "VirtualClock", "steps"]
