"""Health: the rules that judge a GPU's measured health, declared in one table (health.rules: signal, window,
threshold, severity, what ends it, source), NVIDIA's Xid catalog as data (health.xids), the signals they read that
are more than one reading (health.signals), and the verdict, their combination (health.verdict). Pure: no clock,
no I/O."""

from gpuwear.health.rules import RULES, TABLE, Rule, mode_problems
from gpuwear.health.signals import incident_summary, past_cards, peer_rates, repeated_incidents, slow_reads_text
from gpuwear.health.verdict import STATUS_ORDER, rule, verdict
from gpuwear.health.xids import XID_ACT, XID_WATCH

__all__ = ["RULES", "STATUS_ORDER", "TABLE", "XID_ACT", "XID_WATCH", "Rule", "incident_summary",
           "mode_problems", "past_cards", "peer_rates", "repeated_incidents", "rule", "slow_reads_text", "verdict"]
