"""Predict an iteration of a plan: the event-driven simulator, its result, and pictures of both.

`simulate(plan, costs, cluster, schedule)` (simulator.py) returns a `SimResult` (result.py);
engine.py runs the schedule (cores.py: ranks that share a node's host cores wait for one);
gantt.py, stage_picture.py and trace.py draw it. No torch here: plain numbers only.
"""
