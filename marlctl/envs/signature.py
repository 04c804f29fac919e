"""The keyword parameters an env factory takes, read from its signature.

PettingZoo factories hide their parameters behind `**kwargs`: `parallel_env(**kwargs)` calls
`env(**kwargs)`, which calls `raw_env(**kwargs)`, which may hand them on to the class that
does the work (`MultiWalkerEnv(*args, **kwargs)`) or keep them for later
(`self._kwargs = kwargs`, then `CooperativePong(rng, **self._kwargs)` in another method).
So where a callable takes `**kwargs`, we follow them: into every call in its source that
passes them on, and take the parameters every such callee accepts. Where they go nowhere
we can read, the factory counts as accepting any keyword.

Pure: `inspect` and `ast` only; nothing is called, only imported modules are read.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REQUIRED = inspect.Parameter.empty  # the default of a parameter that has none
_DEPTH = 8  # wrappers followed before giving up (PettingZoo's factories need 3)


@dataclass(frozen=True)
class FactoryParams:
    """Keyword parameters (name -> default, or REQUIRED) and whether others are taken too."""

    defaults: dict[str, Any] = field(default_factory=dict)
    open: bool = False  # takes keywords it does not name (**kwargs that lead nowhere known)

    def accepts(self, name: str) -> bool:
        return self.open or name in self.defaults


OPEN = FactoryParams(open=True)


def factory_params(factory: Callable[..., Any]) -> FactoryParams:
    """The keyword parameters `factory` (a function or a class) accepts."""
    return _params(factory, None, 0, 0, set())


def method_params(owner: type, name: str) -> FactoryParams:
    """The keyword parameters of method `name` of class `owner` (without `self`)."""
    return _params(getattr(owner, name), owner, 1, 0, set())


def _params(fn: Any, owner: type | None, skip: int, depth: int, seen: set[int]) -> FactoryParams:
    """`fn`'s keywords; `skip` leading parameters are filled positionally (self, or the
    positional arguments of the call that led here)."""
    if isinstance(fn, type):
        init = fn.__init__
        if init is object.__init__:
            return FactoryParams()
        return _params(init, fn, skip + 1, depth, seen)
    if depth > _DEPTH or id(fn) in seen or not callable(fn):
        return OPEN
    seen = seen | {id(fn)}
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C extension without a signature
        return OPEN
    defaults: dict[str, Any] = {}
    var_keyword = None
    for index, p in enumerate(signature.parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            var_keyword = p.name
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and index >= skip:
            defaults[p.name] = p.default
    if var_keyword is None:
        return FactoryParams(defaults)
    forwarded = [
        _params(callee, callee_owner, callee_skip, depth + 1, seen)
        for callee, callee_owner, callee_skip in _forwards(fn, owner, var_keyword)
    ]
    if not forwarded:
        return FactoryParams(defaults, open=True)
    # The keywords reach every callee: each must accept them.
    closed = [f for f in forwarded if not f.open]
    if not closed:
        return FactoryParams(defaults, open=True)
    names = set.intersection(*(set(f.defaults) for f in closed))
    for f in closed:
        for name in f.defaults:
            if name in names and name not in defaults:
                defaults[name] = f.defaults[name]
    return FactoryParams(defaults)


def _forwards(fn: Any, owner: type | None, var_keyword: str):
    """(callee, its class when it is a method, parameters filled positionally) for each call
    that passes `fn`'s `**var_keyword` on, directly or through an attribute of `self`."""
    tree = _tree(fn)
    if tree is None:
        return []
    kept = set()  # attributes of self the keywords are stored in: `self._kwargs = kwargs`
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_name(node.value, var_keyword):
            kept.update(t.attr for t in node.targets if _is_self_attribute(t))
    calls = [
        (fn, call) for call, star in _calls(tree) if any(_is_name(k, var_keyword) for k in star)
    ]
    if kept and owner is not None:
        for _, method in inspect.getmembers(owner, inspect.isfunction):
            other = _tree(method)
            for call, star in _calls(other) if other is not None else ():
                if any(_is_self_attribute(k) and k.attr in kept for k in star):
                    calls.append((method, call))
    found = []
    for where, call in calls:
        callee, callee_owner, bound = _resolve(call.func, where, owner)
        if callee is None:
            continue
        # Arguments before a `*args` fill the first parameters; what `*args` holds is not
        # known here (it is empty in the factories we follow).
        positional = 0
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                break
            positional += 1
        found.append((callee, callee_owner, positional + bound))
    return found


def _tree(fn: Any) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _calls(tree: ast.AST):
    """Each call in `tree`, with the values of its `**` arguments."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, [k.value for k in node.keywords if k.arg is None]


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_self_attribute(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _resolve(func: ast.AST, where: Any, owner: type | None) -> tuple[Any, type | None, int]:
    """The object a call's function expression names in `where`'s scope, its class when it
    is a method, and 1 when `self` is bound implicitly: `raw_env`, `self.payoff`,
    `EzPickle.__init__` (unbound: `self` is passed by hand)."""
    if isinstance(func, ast.Name):
        try:
            scope = inspect.getclosurevars(where)
        except (TypeError, ValueError):
            return None, None, 0
        for names in (scope.nonlocals, scope.globals, scope.builtins):
            if func.id in names:
                return names[func.id], None, 0
        return None, None, 0
    if _is_self_attribute(func) and owner is not None:
        return getattr(owner, func.attr, None), owner, 1
    if isinstance(func, ast.Attribute):
        base, _, _ = _resolve(func.value, where, owner)
        value = getattr(base, func.attr, None) if base is not None else None
        return value, base if isinstance(base, type) else None, 0
    return None, None, 0
