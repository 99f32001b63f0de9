"""Stage graphs and the planners that make them.

`graphpipe.plan` is also the name of the public function `gp.plan` (in `graphpipe.planning`).
Once this sub-package is imported, Python binds it as the attribute `plan` of `graphpipe`,
hiding the lazy export; so the package itself is made callable and forwards to
`graphpipe.planning.plan`, and `gp.plan(...)` works whichever was imported first.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from graphpipe.planning import plan

        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
