"""The analytics' parameters, from :mod:`infra.settings` (rule thresholds are data, not code)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings import Settings


@dataclass(frozen=True)
class AnalyticsConfig:
    lateness_s: int = 120
    burst_posts: int = 10  # more than this many posts ...
    burst_window_s: int = 10  # ... by one user within this many seconds
    churn_within_s: int = 60  # a follow undone within this many seconds is one churn
    churn_repeats: int = 3  # this many churns ...
    churn_window_s: int = 600  # ... by one user within this window
    flood_recipients: int = 20  # messages to at least this many distinct recipients ...
    flood_window_s: int = 60  # ... by one sender within this window
    read_within_h: int = 24  # message_read joined to its message_sent within this many hours

    @property
    def lateness(self) -> str:
        return f"{self.lateness_s} seconds"

    @property
    def lateness_ms(self) -> int:
        return self.lateness_s * 1000

    @classmethod
    def from_settings(cls, settings: Settings) -> AnalyticsConfig:
        return cls(
            lateness_s=settings.analytics_lateness_s,
            burst_posts=settings.rule_burst_posts,
            burst_window_s=settings.rule_burst_window_s,
            churn_within_s=settings.rule_churn_within_s,
            churn_repeats=settings.rule_churn_repeats,
            churn_window_s=settings.rule_churn_window_s,
            flood_recipients=settings.rule_flood_recipients,
            flood_window_s=settings.rule_flood_window_s,
        )
