"""Schedule trees as text (isl's own, readable back) and as JSON for the service and the
browser view: one object per node with its kind, its set or schedule, band flags and
children."""
from __future__ import annotations

import islpy as isl

_KIND = {
    isl.schedule_node_type.band: "band", isl.schedule_node_type.context: "context",
    isl.schedule_node_type.domain: "domain", isl.schedule_node_type.expansion: "expansion",
    isl.schedule_node_type.extension: "extension", isl.schedule_node_type.filter: "filter",
    isl.schedule_node_type.guard: "guard", isl.schedule_node_type.leaf: "leaf",
    isl.schedule_node_type.mark: "mark", isl.schedule_node_type.sequence: "sequence",
    isl.schedule_node_type.set: "set",
}


def node_to_json(node: isl.ScheduleNode) -> dict:
    kind = _KIND[node.get_type()]
    out: dict = {"kind": kind}
    if kind == "domain":
        out["domain"] = node.domain_get_domain().to_str()
    elif kind == "filter":
        out["filter"] = node.filter_get_filter().to_str()
    elif kind == "mark":
        out["mark"] = node.mark_get_id().get_name()
    elif kind == "band":
        n = node.band_n_member()
        out["schedule"] = node.band_get_partial_schedule().to_str()
        out["members"] = n
        out["permutable"] = bool(node.band_get_permutable())
        out["coincident"] = [bool(node.band_member_get_coincident(i)) for i in range(n)]
    out["children"] = [node_to_json(node.child(i)) for i in range(node.n_children())
                       if not (kind in ("band", "filter", "mark", "domain")
                               and _KIND[node.child(i).get_type()] == "leaf")]
    return out


def schedule_to_json(schedule: isl.Schedule) -> dict:
    return node_to_json(schedule.get_root())


def schedule_to_text(schedule: isl.Schedule) -> str:
    """isl's block YAML form, which `schedule_from_text` reads back (for repros).

    Printed from the schedule, not from its root node: a node prints with a
    "# YOU ARE HERE" line marking its position, which is noise in a dump or a diff."""
    printer = isl.Printer.to_str(schedule.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()


def schedule_from_text(text: str, ctx: isl.Context | None = None) -> isl.Schedule:
    return isl.Schedule.read_from_str(ctx or isl.DEFAULT_CONTEXT, text)
