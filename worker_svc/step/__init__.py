"""One step as the worker runs it: the wire's StepPlan read once, at the runner's door,
into plain values (description.py) that the real runner and the null runner consume;
reading checks the plan against what the worker holds (reader.py)."""
