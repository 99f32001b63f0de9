"""Schedules as data: actions with a text form, generators (1f1b, gpipe, kfkb, zero-bubble), lowering and validation.

`make_schedule(plan, kind)` (generate.py) builds per-stage action lists, `validate_schedule`
(validate.py) dry-runs them under the communication contract written in action.py.
"""
