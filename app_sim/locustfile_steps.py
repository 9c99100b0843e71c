"""The users of ``app_sim/locustfile.py`` under a step load: where does the read target stop holding?

``python -m app_sim.load --steps`` (``make load-steps``): ``--step-users`` more users every
``--step-seconds``, ``--steps`` times (Locust options, so also ``LOCUST_STEP_USERS`` ... or
``locust.conf``). ``app_sim.load`` then plots requests/s and p99 per step against the users and
says up to how many users the reads' p99 stayed within ``--max-read-p99-ms``.
"""

from __future__ import annotations

from locust import LoadTestShape, events

from app_sim.locustfile import SocialUser  # noqa: F401 - the users this shape drives (and its listeners)


@events.init_command_line_parser.add_listener
def _steps(parser) -> None:
    parser.add_argument(
        "--step-users", type=int, default=25, env_var="LOCUST_STEP_USERS", help="users per step"
    )
    parser.add_argument(
        "--step-seconds", type=int, default=20, env_var="LOCUST_STEP_SECONDS", help="step length"
    )
    parser.add_argument("--steps", type=int, default=6, env_var="LOCUST_STEPS", help="number of steps")


class StepLoad(LoadTestShape):
    """``step_users`` x k users during step k (k = 1 .. steps), spawned within a second or two."""

    def tick(self):
        o = self.runner.environment.parsed_options
        step = int(self.get_run_time() // o.step_seconds)
        if step >= o.steps:
            return None
        return (step + 1) * o.step_users, max(o.step_users, 10)
