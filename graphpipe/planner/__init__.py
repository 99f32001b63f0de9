"""Stage graphs and the planners that make them.

The public entry point is `graphpipe.plan` (in `graphpipe/planning.py`), which ranks this
package's candidates by simulated iteration time. The package is called `planner`, not
`plan`, because Python binds an imported sub-package as an attribute of its parent: a
sub-package `graphpipe.plan` would shadow the function `gp.plan`.
"""
