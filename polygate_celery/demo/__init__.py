"""Edge: the demonstrations behind `polygate-celery demo`.

- `pipeline`: the example pipeline (`example/`, also `examples/pipeline` in the
  repository) end to end on a private setup: a Redis, a simulated provider and a
  real Celery worker. Works from a pip install of the `demo` extra. `report`: what
  such a run did, and the summary it ends with.
- `offline`: the governance loop alone on a simulated workload, in virtual time.
- `cli`: the command itself.
"""

from polygate_celery.demo.offline import run_demo

__all__ = ["run_demo"]
