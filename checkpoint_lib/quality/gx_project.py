"""The GX side: a file context per pipeline, suites loaded from ``expectations/*.json``, one GX
Checkpoint per view (each view is its own DataFrame, and a GX Checkpoint passes the same batch
parameters to all its validation definitions), Data Docs updated by ``UpdateDataDocsAction``.

Layout: the context root is ``W/_quality/<pipeline>/gx``; the Data Docs site ``local_site`` is
pointed at ``../data_docs/`` (relative, so a copied or moved warehouse keeps working), i.e.
``W/_quality/<pipeline>/data_docs/index.html``. Suites, validation definitions and checkpoints are
``add_or_update``-ed on every run from the JSON files: the JSON in the repository is the source of
truth, what the context stores is a cache of it.

A view is a Spark DataFrame (data source ``warehouse``) or, when it was small enough to collect, a
pandas DataFrame (data source ``warehouse_pandas``: GX's pandas engine, no Spark job). Data Docs are
built once for everything :meth:`GxProject.run` validated since the last :meth:`GxProject.build_docs`
(once per command, however many suites it ran).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .result import ExpectationOutcome

DOCS_SITE = "local_site"
DOCS_DIR = "../data_docs/"  # relative to the context root W/_quality/<p>/gx
DATASOURCE = "warehouse"
PANDAS_DATASOURCE = "warehouse_pandas"


def expectations_dir() -> Path:
    """``$CKPT_EXPECTATIONS_DIR``, else the suites shipped in the package (``quality/expectations/``;
    a checkout's top-level ``expectations/`` links there)."""
    env = os.environ.get("CKPT_EXPECTATIONS_DIR")
    path = Path(env) if env else Path(__file__).resolve().parent / "expectations"
    if not path.is_dir():
        raise FileNotFoundError(f"no expectations folder at {path} (set CKPT_EXPECTATIONS_DIR)")
    return path


@dataclass(frozen=True)
class SuiteSpec:
    """One JSON suite file: per view, the expectation configurations."""

    name: str
    description: str
    views: Mapping[str, Mapping[str, Any]]

    @classmethod
    def load(cls, name: str) -> "SuiteSpec":
        path = expectations_dir() / f"{name}.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"suite file {path} is missing") from None
        except ValueError as exc:
            raise ValueError(f"suite file {path} is not valid JSON: {exc}") from None
        if doc.get("suite") != name or not isinstance(doc.get("views"), dict):
            raise ValueError(f"suite file {path} must have \"suite\": {name!r} and a \"views\" object")
        return cls(name, doc.get("description", ""), doc["views"])

    def in_words(self, words: Mapping[str, str]) -> "SuiteSpec":
        """This suite with each note's ``{role}`` placeholders (``event_sink``, ``event_id``,
        ``event_columns``, ``key_sink``, ``key``, ``aggregates``) replaced by the pipeline's own
        names (:meth:`QualitySpec.words`): a failure speaks of its sinks and columns."""
        def worded(note: str) -> str:
            for role, word in words.items():
                note = note.replace("{" + role + "}", word)
            return note

        views = {}
        for view, spec in self.views.items():
            exps = [dict(e, notes=worded(e["notes"])) if e.get("notes") else e for e in spec.get("expectations", [])]
            views[view] = dict(spec, expectations=exps) if "expectations" in spec else spec
        return SuiteSpec(self.name, self.description, views)

    def with_expectations(self, extra: Mapping[str, Sequence[Any]]) -> "SuiteSpec":
        """This suite plus views checked by GX expectation objects (a pipeline's own invariants)."""
        clash = sorted(set(extra) & set(self.views))
        if clash:
            raise ValueError(f"suite {self.name!r} already has views {clash}")
        added = {view: {"description": f"{view}: the pipeline's own expectations", "gx": list(exps)}
                 for view, exps in extra.items()}
        return SuiteSpec(self.name, self.description, {**self.views, **added})


def _quiet_gx() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # never phone home


def import_gx() -> Any:
    """``great_expectations``, imported. GX imports PySpark's Spark Connect package, which ends the
    process with status 0 when the main module has neither a spec nor a file (``python -c``: it
    takes itself for its own doctests) and one of its dependencies is missing: a validation would
    stop half-way with the status of a success. That exit becomes an error naming the cause."""
    _quiet_gx()
    try:
        import great_expectations as gx
    except SystemExit as exc:
        raise ImportError(
            "great_expectations could not be imported: PySpark's Spark Connect package, imported by it, "
            "ends the process when run under `python -c` without its dependencies (grpcio-status, "
            "zstandard). Run the code from a file, or install them: pip install grpcio-status zstandard"
        ) from exc
    return gx


class GxProject:
    """The GX file context of one pipeline under ``W/_quality/<pipeline>``."""

    def __init__(self, quality_root: Path, pipeline: str):
        gx = import_gx()

        from . import gx_expectations  # noqa: F401  (registers the custom expectations)

        self.gx = gx
        self.pipeline = pipeline
        self.root = quality_root
        self.root.mkdir(parents=True, exist_ok=True)
        self.ctx = gx.get_context(mode="file", project_root_dir=str(self.root))
        self._configure()
        self.pending: list[Any] = []
        """What the next Data Docs build renders: each validation result and its suite."""

    @property
    def data_docs_index(self) -> Path:
        return self.root / "data_docs" / "index.html"

    def _configure(self) -> None:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        v = self.ctx.variables
        changed = False
        if v.analytics_enabled is not False:
            v.analytics_enabled = False
            changed = True
        bars = v.progress_bars
        globally = bars.get("globally") if isinstance(bars, dict) else getattr(bars, "globally", None)
        if globally is not False:
            v.progress_bars = ProgressBarsConfig(globally=False)
            changed = True
        if changed:
            v.save()
        site = (self.ctx.get_config().data_docs_sites or {}).get(DOCS_SITE, {})
        if site.get("store_backend", {}).get("base_directory") != DOCS_DIR:
            config = {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": DOCS_DIR},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
            if site:
                self.ctx.update_data_docs_site(DOCS_SITE, config)
            else:
                self.ctx.add_data_docs_site(DOCS_SITE, config)

    def _expectations(self, view: str, spec: Mapping[str, Any]) -> list[Any]:
        from great_expectations.expectations.registry import get_expectation_impl

        if "gx" in spec:  # expectation objects: copies, so the pipeline's own are never bound to a suite
            out = []
            for i, e in enumerate(spec["gx"]):
                if not isinstance(e, self.gx.expectations.Expectation):
                    raise ValueError(f"view {view!r}, expectation {i}: {e!r} is not a GX expectation")
                copy = e.copy(deep=True)
                copy.id = None
                out.append(copy)
            return out
        out = []
        for i, e in enumerate(spec.get("expectations", [])):
            try:
                cls = get_expectation_impl(e["type"])
            except Exception as exc:
                raise ValueError(f"view {view!r}, expectation {i}: unknown type {e.get('type')!r} ({exc})") from None
            kwargs = dict(e.get("kwargs", {}))
            if e.get("notes"):
                kwargs["notes"] = e["notes"]
            out.append(cls(**kwargs))
        return out

    def _source(self, df: Any, sources: dict[str, Any]) -> Any:
        """The data source for view ``df``: pandas for a pandas DataFrame, else Spark (each made
        once per run, in ``sources``)."""
        import pandas as pd

        name = PANDAS_DATASOURCE if isinstance(df, pd.DataFrame) else DATASOURCE
        if name not in sources:
            add = self.ctx.data_sources.add_or_update_pandas if name == PANDAS_DATASOURCE else \
                self.ctx.data_sources.add_or_update_spark
            sources[name] = add(name)
        return sources[name]

    def run(self, suite: SuiteSpec, views: Mapping[str, Any], run_name: str,
            progress: Callable[[str, str], None] | None = None, *, build_docs: bool = True) -> list[ExpectationOutcome]:
        """Validate each DataFrame of ``views`` (Spark or pandas) against its part of ``suite`` (a
        view the suite does not name is an error; a named view that is absent is skipped by the
        caller's choice). One GX Checkpoint run per view, all under one run name; then one Data
        Docs update for all of them (the index is rendered once per run, not once per view), or,
        without ``build_docs``, none yet: :meth:`build_docs` renders them with the next ones."""
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        gx = self.gx
        unknown = sorted(set(views) - set(suite.views))
        if unknown:
            raise ValueError(f"suite {suite.name!r} has no expectations for views {unknown}")
        sources: dict[str, Any] = {}
        run_id = RunIdentifier(run_name=run_name, run_time=dt.datetime.now(dt.timezone.utc))
        outcomes: list[ExpectationOutcome] = []
        documents: list[Any] = []  # what the Data Docs update renders: each result and its suite
        for view, df in views.items():
            source = self._source(df, sources)
            name = f"{self.pipeline}.{suite.name}.{view}"
            asset_name = f"{suite.name}.{view}"
            try:
                asset = source.get_asset(asset_name)
            except LookupError:
                asset = source.add_dataframe_asset(asset_name)
            try:
                batch = asset.get_batch_definition("whole_dataframe")
            except (KeyError, LookupError):
                batch = asset.add_batch_definition_whole_dataframe("whole_dataframe")
            gx_suite = self.ctx.suites.add_or_update(
                gx.ExpectationSuite(name=name, expectations=self._expectations(view, suite.views[view]),
                                    meta={"notes": suite.views[view].get("description", "")})
            )
            vd = _stored(self.ctx.validation_definitions, self.ctx.validation_definition_store,
                         gx.ValidationDefinition(name=name, data=batch, suite=gx_suite))
            cp = _stored(self.ctx.checkpoints, self.ctx.checkpoint_store,
                         gx.Checkpoint(name=name, validation_definitions=[vd], actions=[],
                                       result_format={"result_format": "SUMMARY"}))
            result = cp.run(batch_parameters={"dataframe": df}, run_id=run_id)
            for identifier, suite_result in result.run_results.items():
                documents += [identifier, ExpectationSuiteIdentifier(name=suite_result.suite_name)]
                for r in suite_result.results:
                    outcomes.append(_outcome(view, r))
            if progress is not None:
                progress("validated", view)
        self.pending += documents  # a run that raised renders nothing
        if build_docs:
            self.build_docs()
        return outcomes

    def build_docs(self) -> None:
        """Render the Data Docs pages of every validation since the last build, and the index once."""
        if self.pending:
            self.ctx.build_data_docs(site_names=[DOCS_SITE], resource_identifiers=self.pending, dry_run=False,
                                     build_index=True)
            self.pending = []


def _stored(factory: Any, store: Any, obj: Any) -> Any:
    """``factory.add_or_update(obj)``, replacing a stored version GX can no longer load: one that
    names a data asset of the other engine's data source (a view validated on Spark last time and
    on pandas now, or the reverse), which that source's next ``add_or_update`` dropped."""
    try:
        return factory.add_or_update(obj)
    except Exception:
        key = store.get_key(name=obj.name, id=None)
        if not store.has_key(key):
            raise
        store.remove_key(key)
        return factory.add_or_update(obj)


def _outcome(view: str, r: Any) -> ExpectationOutcome:
    cfg = r.expectation_config
    kw = cfg.kwargs
    target = kw.get("column") or ", ".join(str(kw[k]) for k in ("column_A", "column_B") if k in kw) or "table"
    res = r.result or {}
    info = r.exception_info or {}
    raised = info.get("raised_exception") if isinstance(info, dict) else None
    error = (info.get("exception_message") or "exception") if raised else None
    return ExpectationOutcome(
        view=view,
        expectation=cfg.type,
        target=target,
        success=bool(r.success) and not raised,
        observed=_plain(res.get("observed_value")),
        unexpected_count=res.get("unexpected_count"),
        element_count=res.get("element_count"),
        error=error,
        notes=(cfg.notes if isinstance(getattr(cfg, "notes", None), str) else None),
    )


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
