"""Which tests must share a pytest-xdist worker (`pytest -n 2 --dist loadgroup`).

A session- or module-scoped fixture is set up once per xdist worker that runs a test
asking for it. For the cheap ones that costs nothing; for the ones that start a
stack of processes or load the model's weights (HEAVY_SESSION_FIXTURES, and any
module-scoped fixture of a process or model test) a second set-up costs seconds of
CPU that the two cores would otherwise spend on tests. So every test that shares such
a fixture with another goes into one `xdist_group` with it: the tests of a process or
model module together, and all the tests that ask for one heavy session fixture
together (a connected component: a module asking for two of them joins both).
Tests that start no process and load no weights are left to xdist's load balancing.
In a run without -n this does nothing.

The group travels as xdist's own `xdist_group` mark does, as a suffix `@group` of the
test's id that the controller's LoadGroupScheduling splits off; it is written here
rather than through the mark because pytest 9.2's structured node ids made xdist
3.8's write of the suffix a silent no-op (pytest-dev/pytest-xdist#1386: every test
was balanced one by one). Once xdist ships its fix, the mark can replace `_suffix`.
"""

from __future__ import annotations

# Session fixtures that start processes or load weights (tests/worker/conftest.py,
# tests/integration/conftest.py); those built on them count through their own
# arguments (pytest lists a test's whole fixture closure in item.fixturenames).
HEAVY_SESSION_FIXTURES = frozenset(
    {
        "loaded_model",
        "reference_model",
        "q4_1",
        "stack",
        "chunked_stack",
        "pool_stack",
        "two_worker_stack",
    }
)
HEAVY_MARKERS = ("process", "model")


def group_for_workers(config, items) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing to share out
        return
    parent = list(range(len(items)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_with: dict[str, int] = {}
    heavy = []
    for index, item in enumerate(items):
        if not any(item.get_closest_marker(name) for name in HEAVY_MARKERS):
            continue
        heavy.append(index)
        keys = [f"module:{item.module.__name__}"] if item.module else []
        keys += [f"fixture:{name}" for name in HEAVY_SESSION_FIXTURES & set(item.fixturenames)]
        for key in keys:
            other = first_with.setdefault(key, index)
            parent[find(index)] = find(other)
    for index in heavy:
        root = items[find(index)]
        _suffix(items[index], root.nodeid.split("::")[0])


def _suffix(item, group: str) -> None:
    """`item`'s id + "@group", what --dist loadgroup reads (see the module's docstring)."""
    suffixed = f"{item.nodeid}@{group}"
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2: the id is structured
    except ImportError:
        item._nodeid = suffixed
    else:
        item._id = NodeId.parse(suffixed)
    assert item.nodeid == suffixed
