"""Feeding the agent's pure step a timed sequence of events (the decisions' table tests)."""

from __future__ import annotations

from training_toolkit.agent.decisions import step


def run(state, *timed_events):
    """Feed (now, event) pairs to ``step`` in order: the final state, and every action in order."""
    actions = []
    for now, event in timed_events:
        state, new = step(state, event, now)
        actions += new
    return state, actions
