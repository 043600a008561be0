"""The commands that read what a pipeline is or left: ``ckpt pipelines``, ``graph`` (its dataflow
graph drawn), ``checkpoints`` (list; show: a checkpoint per vertex of the pipeline's graph, then
per subtask), ``state`` (operator, channel, handles) and ``report``. Each takes a dataflow graph
too (``checkpoints`` and ``report`` read only the control tables, which a graph's runner writes
like a linear pipeline's; ``state operator --uid`` picks one keyed operator of a graph).
They read with delta-rs and start no JVM (``tests/cli/test_inspect_commands.py`` runs them where
pyspark cannot be imported)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Mapping

from ..pipeline import sink_target
from . import context
from .output import EXIT_OK, emit, wants_json


def cmd_pipelines(args: argparse.Namespace) -> int:
    """Every registered pipeline, linear or a dataflow graph (``kind``), with its shape."""
    from ..graph import OperatorKind, from_pipeline, shape
    from ..pipelines import declared, is_graph, names, ref_of

    rows, shapes = [], {}
    for name in names():
        p = declared(name)
        found_by = ref_of(name) if ref_of(name) != name else "entry point"
        if is_graph(p):
            graph = p
            row = {"name": name, "kind": "graph", "found_by": found_by,
                   "source": ", ".join(v.spec.path for v in graph.sources),
                   "sources": {v.name: v.spec.path for v in graph.sources},
                   "sinks": {s.name: sink_target(s.spec) for s in graph.sinks},
                   "operator": ", ".join(v.uid for v in graph.operators),
                   "operators": [v.uid for v in graph.operators],
                   "keyed": any(v.kind is not OperatorKind.STATELESS for v in graph.operators),
                   "generator": graph.generator_fn is not None, "quality": graph.quality is not None}
        else:
            graph = from_pipeline(p)
            row = {"name": name, "kind": "pipeline", "found_by": found_by, "source": p.source_spec.path,
                   "sinks": {n: sink_target(s) for n, s in p.sinks.items()}, "operator": p.operator_uid, "keyed": p.keyed,
                   "generator": p.generator_fn is not None, "quality": p.quality_spec is not None}
        shapes[name] = shape(graph, sinks=False)  # the line names the sinks
        row["graph"] = {"vertices": len(graph.vertices), "edges": len(graph.edges),
                        "feedback_edges": sum(e.feedback for e in graph.edges)}
        rows.append(row)
    if wants_json(args):
        emit(rows)
        return 0
    for r in rows:
        extras = [w for w in ("generator", "quality") if r[w]]
        kind = "graph, " if r["kind"] == "graph" else ""
        print(f"{r['name']:<16} {r['source']} -> {r['operator']} -> {', '.join(r['sinks'].values())}"
              f"  ({r['found_by']}; {kind}{shapes[r['name']]}{'; ' + ', '.join(extras) if extras else ''})")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    """The pipeline's dataflow graph (:mod:`checkpoint_lib.graph`), drawn: text, Graphviz dot or JSON."""
    from ..graph import Layout, plan, to_dict, to_dot, to_text
    from ..pipelines import graph_of

    context.importable_from_here(args.graph_ref)
    graph = graph_of(args.graph_ref)
    job = plan(graph, Layout(args.layout)) if getattr(args, "layout", None) else None
    if wants_json(args):
        emit({**to_dict(graph), **({"plan": job.to_dict()} if job is not None else {})})
    else:
        print(to_dot(graph, job) if args.output == "dot" else to_text(graph, job), end="")
    return EXIT_OK


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from ..delta.store import DeltaCheckpointStore
    from ..graph.details import to_text as details_text
    from ..history import format_table, with_durations
    from ..layout import checkpoint_root

    store = DeltaCheckpointStore.existing(checkpoint_root(args.warehouse, args.pipeline))
    if args.action == "list":
        rows = with_durations(store.checkpoints.history()[: args.limit])
        if wants_json(args):
            emit([_nested_acks(r) for r in rows])
        else:
            print(format_table(rows, ["checkpoint_id", "kind", "status", "epoch", "trigger_time", "duration_ms",
                                      "state_bytes", "channel_state_rows", "alignment_ms", "unaligned",
                                      "failure_reason"]))
        return 0
    if args.id is None:
        raise ValueError("checkpoints show needs a checkpoint id")
    doc, details = checkpoint_document(store, args.pipeline, args.id)
    if wants_json(args):
        emit(doc)
        return 0
    acks = doc["acks"]
    print(f"{doc['kind'] or 'checkpoint'} {args.id} of {args.pipeline}: {doc['status'] or 'unknown'}"
          f"{'' if doc['epoch'] is None else ', epoch ' + str(doc['epoch'])}; {len(acks)} subtasks acknowledged")
    if doc["graph_problem"]:
        print(f"(per operator id: the graph of {args.pipeline} cannot be loaded: {doc['graph_problem']})")
    print(details_text(details))
    print()
    print(format_table([{k: v for k, v in a.items() if k != "state"} for a in acks]))
    for a in acks:
        print(f"{a['subtask']}: {json.dumps(a['state'], default=str)}")
    return 0


def checkpoint_document(store: Any, pipeline: str, checkpoint_id: int) -> tuple[dict[str, Any], list[Any]]:
    """What ``checkpoints show -o json`` prints: the checkpoint's status row (``kind``, ``status``,
    ``epoch``, times), ``vertices`` (per vertex of the pipeline's graph,
    :func:`~checkpoint_lib.graph.details.checkpoint_details`; by operator id, and
    ``graph_problem`` saying why, when the graph cannot be loaded) and ``acks`` (per subtask, as
    the store keeps them: the list ``-o json`` printed alone before, every key kept); and the
    vertices as values, for the text."""
    from ..graph.details import checkpoint_details
    from ..pipelines import graph_or_why

    acks = store.checkpoints.acks(checkpoint_id)  # UnknownCheckpointError (exit 3) for an unknown id
    row = store.checkpoints.status(checkpoint_id) or {}
    graph, problem = graph_or_why(pipeline)
    details = checkpoint_details(graph, acks)
    done, start = row.get("completion_time"), row.get("trigger_time")
    return {"pipeline": pipeline, "checkpoint_id": checkpoint_id, "kind": row.get("kind"), "status": row.get("status"),
            "epoch": row.get("epoch"), "trigger_time": start, "completion_time": done,
            "duration_ms": round((done - start) * 1000, 1) if done and start else None,
            "graph_problem": problem, "vertices": [v.to_dict() for v in details], "acks": acks}, details


def _nested_acks(row: Mapping[str, Any]) -> dict[str, Any]:
    """A history row for ``-o json``: its ``acks_json`` (the stored text) as the object ``acks``."""
    out = {k: v for k, v in row.items() if k != "acks_json"}
    text = row.get("acks_json")
    try:
        out["acks"] = json.loads(text) if text else None
    except ValueError:  # a corrupt row (``corrupt`` says so): its text, as stored
        out["acks"] = {"unreadable": text}
    return out


def cmd_state(args: argparse.Namespace) -> int:
    """Read with delta-rs: no JVM. A linear pipeline or a dataflow graph (``--uid``: which keyed
    operator; a linear pipeline's, or a graph's only one, by default)."""
    from ..delta import inspect
    from ..history import format_table

    for option, value in (("--key", args.key), ("--uid", args.uid)):
        if value is not None and args.what != "operator":
            raise ValueError(f"{option} picks {'a key of ' if option == '--key' else ''}the operator's state: "
                             f"ckpt state operator {args.pipeline} {option} ...")
    pipeline = context.declared(args.pipeline)
    if args.what == "operator":
        doc = inspect.operator_state(args.warehouse, pipeline, args.checkpoint, uid=args.uid, key=args.key,
                                     limit=args.limit)
    elif args.what == "channel":
        doc = inspect.channel_state(args.warehouse, pipeline, args.checkpoint, limit=args.limit)
    else:
        doc = inspect.handles(args.warehouse, pipeline, args.checkpoint)
    if wants_json(args):
        emit(doc)
        return EXIT_OK
    at = f"{doc['kind']} {doc['checkpoint_id']} (completed {_utc(doc['completed_at'])})"
    if args.what == "operator":
        versions = sorted({s["table_version"] for s in doc["subtasks"]})
        spans = [s["key_groups"] for s in doc["subtasks"]]
        print(f"operator {doc['operator']} of {doc['pipeline']} at {at}: state table "
              f"{'version' if len(versions) == 1 else 'versions'} {', '.join(map(str, versions))}, key groups "
              f"{min(lo for lo, _ in spans)}..{max(hi for _, hi in spans)} over {len(spans)} subtasks")
        which = f"key {doc['key_column']} = {doc['key']!r}: " if doc["key"] is not None else ""
        more = f"; showing the first {doc['shown']} (--limit)" if doc["shown"] < doc["keys"] else ""
        print(f"{which}{doc['keys']:,} {'key' if doc['keys'] == 1 else 'keys'}{more}")
        columns = [doc["key_column"], *[c for c in (doc["rows"][0] if doc["rows"] else {})
                                        if c not in (doc["key_column"], "subtask")], "subtask"]
        if doc["rows"]:
            print(format_table(doc["rows"], columns))
    elif args.what == "channel":
        print(f"channel state of {doc['pipeline']} at {at}: {doc['records']:,} in-flight records"
              + "".join(f"\n  {s['subtask']}: {s['rows']:,} records" for s in doc["subtasks"]))
        if doc["rows"]:
            more = f" (the first {doc['shown']}, --limit)" if doc["shown"] < doc["records"] else ""
            print(f"records{more}:")
            print(format_table(doc["rows"]))
    else:
        print(f"handles of {doc['pipeline']} at {at}")
        for subtask, state in doc["sources"].items():
            print(f"  {subtask}: offset version {state.get('version')}")
        for subtask, snapshot in doc["sinks"].items():
            pending = ", ".join(t["txn_id"] + f".e{t['epoch']}.s{t['seq']}" for t in snapshot.get("pending", []))
            print(f"  {subtask}: owns {pending or 'nothing'}; open {snapshot['current']['txn_id']}")
    return EXIT_OK


def _utc(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def cmd_report(args: argparse.Namespace) -> int:
    from ..quality import write_report

    path = write_report(args.pipeline, args.warehouse, args.out)
    if wants_json(args):
        emit({"pipeline": args.pipeline, "report": str(path)})
    else:
        print(f"report: {path}")
    return 0
