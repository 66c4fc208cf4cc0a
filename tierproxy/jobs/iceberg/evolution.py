"""How a typed table's columns follow the value schema's versions: the one rule the planner and the decoder use.

A new version of the subject is a **compatible change** of the table when, field by field (by name, nested too):
- a field the table has not: added (an optional column; field ids stay stable, new ones are new ids);
- the same type, or a widening Iceberg allows in place: int → long, float → double, decimal(p, s) → decimal(p', s)
  with p' ≥ p; a required column may become optional;
- every required column of the table is still there (a required field renamed or removed is not compatible: its
  records would need a value the record does not have).
Anything else (a narrowing such as long → int, a type changed to another, a list made a map) is **incompatible**:
the table is left as it is and that version's records go to the dead-letter table with the reason.

A record written with an older version, or with a schema of another subject, **fits** the table when each of its
fields is a column of the same type or of one its type widens to, and each required column is in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_WIDENINGS = {("int", "long"), ("float", "double")}


def change_reason(table: Sequence[Any], new: Sequence[Any], path: str = "") -> str | None:
    """Why the version with fields `new` cannot evolve a table with fields `table`; None when it can."""
    have = {f.name: f for f in table}
    names = {f.name for f in new}
    for f in table:
        if f.required and f.name not in names:
            return f"required column {path}{f.name} is not in this version (renamed or removed)"
    for f in new:
        old = have.get(f.name)
        if old is not None and (why := _type_change(old.field_type, f.field_type, f"{path}{f.name}")):
            return why
    return None


def fits_reason(table: Sequence[Any], writer: Sequence[Any], path: str = "") -> str | None:
    """Why records of the schema with fields `writer` cannot be rows of a table with fields `table`; None when they
    can (each field a column whose type is the same or wider, each required column present)."""
    have = {f.name: f for f in table}
    names = {f.name for f in writer}
    for f in table:
        if f.required and f.name not in names:
            return f"required column {path}{f.name} is not in the record's schema"
    for f in writer:
        col = have.get(f.name)
        if col is None:
            return f"field {path}{f.name} is not a column of the table"
        if col.required and not f.required:
            return f"field {path}{f.name} is optional, its column is required"
        if why := _type_fits(f.field_type, col.field_type, f"{path}{f.name}"):
            return why
    return None


def _kind(t: Any) -> str:
    return str(t).split("(")[0].split("<")[0].split("[")[0]


def _both(a: Any, b: Any, kind: str) -> bool:
    from pyiceberg import types

    cls = {"struct": types.StructType, "list": types.ListType, "map": types.MapType}[kind]
    return isinstance(a, cls) and isinstance(b, cls)


Rule = Callable[[Any, Any, str], "str | None"]


def _walk(a: Any, b: Any, path: str, structs: Rule, leaves: Rule) -> str | None:
    """Two types side by side through lists and maps: `structs` decides two structs, `leaves` anything else."""
    if _both(a, b, "struct"):
        return structs(a, b, f"{path}.")
    if _both(a, b, "list"):
        return _walk(a.element_type, b.element_type, f"{path}[]", structs, leaves)
    if _both(a, b, "map"):
        return _walk(a.value_type, b.value_type, f"{path}{{}}", structs, leaves)
    return leaves(a, b, path)


def _leaf_change(old: Any, new: Any, path: str) -> str | None:
    if old == new or (_kind(old), _kind(new)) in _WIDENINGS:
        return None
    if _kind(old) == _kind(new) == "decimal" and old.scale == new.scale and new.precision >= old.precision:
        return None
    return f"column {path} is {old}, this version has {new} (not a widening Iceberg allows)"


def _type_change(old: Any, new: Any, path: str) -> str | None:
    """Why `old` cannot become `new` in place (None: same, or a widening, or nested changes that are compatible)."""
    return _walk(old, new, path, lambda o, n, p: change_reason(o.fields, n.fields, p), _leaf_change)


def _type_fits(writer: Any, column: Any, path: str) -> str | None:
    return _walk(writer, column, path, lambda w, c, p: fits_reason(c.fields, w.fields, p),
                 lambda w, c, p: _leaf_change(w, c, p) and f"field {p} is {w}, its column is {c}")


def optional_copy(fields: Sequence[Any]) -> list[Any]:
    """`fields` with every field optional, nested too: what union-by-name adds as new columns (Iceberg adds only
    optional columns to a table that has rows)."""
    from pyiceberg.types import ListType, MapType, NestedField, StructType

    def loosen(t: Any) -> Any:
        if isinstance(t, StructType):
            return StructType(*optional_copy(t.fields))
        if isinstance(t, ListType):
            return ListType(t.element_id, loosen(t.element_type), element_required=False)
        if isinstance(t, MapType):
            return MapType(t.key_id, t.key_type, t.value_id, loosen(t.value_type), value_required=False)
        return t

    return [NestedField(f.field_id, f.name, loosen(f.field_type), required=False) for f in fields]


def evolve(table_fields: Sequence[Any], new: Sequence[Any]) -> list[Any]:
    """The fields after a version: existing columns widened or made optional in place (their ids kept), never
    narrowed, none removed; new ones appended as optional, nested alike. Ids of new fields are placeholders: the
    table assigns its own (pyiceberg's union-by-name, which this mirrors, does)."""
    from pyiceberg.types import ListType, MapType, NestedField, StructType

    def merged(old: Any, t: Any) -> Any:
        if isinstance(old, StructType) and isinstance(t, StructType):
            return StructType(*evolve(old.fields, t.fields))
        if isinstance(old, ListType) and isinstance(t, ListType):
            return ListType(old.element_id, merged(old.element_type, t.element_type),
                            element_required=old.element_required and t.element_required)
        if isinstance(old, MapType) and isinstance(t, MapType):
            return MapType(old.key_id, old.key_type, old.value_id, merged(old.value_type, t.value_type),
                           value_required=old.value_required and t.value_required)
        if old == t or _type_change(old, t, "") is not None:
            return old  # the same, or `t` is narrower (an older version's type): the column keeps its type
        return t

    by_name = {f.name: f for f in new}
    out = [NestedField(f.field_id, f.name, merged(f.field_type, by_name[f.name].field_type),
                       required=f.required and by_name[f.name].required) if f.name in by_name else f
           for f in table_fields]
    known = {f.name for f in table_fields}
    out += optional_copy([f for f in new if f.name not in known])
    return out
