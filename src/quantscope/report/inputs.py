"""What each ``quantscope report`` input file must be: its kind is told from its content.

=============  ==============================================================
``results``    a demo JSON (``{"results": {label: result}}``), one evaluate
               result (``{"metrics": ...}``) or a ``buckets`` choice (``"buckets"``
               and ``"candidates"``)
``plan``       a plan JSON (``"format": "quantscope.plan/1"`` or default + groups)
``analysis``   an analysis JSON (``"format": "quantscope.analysis/1"``)
=============  ==============================================================

A file given for the wrong option is one line naming what it is and the option it
belongs to, instead of an empty or broken section.
"""

from __future__ import annotations

from typing import Any

from quantscope.types import QuantscopeError

OPTION = {"results": "--results", "plan": "--plan", "analysis": "--analysis"}


def _is_result(doc: dict[str, Any]) -> bool:
    return isinstance(doc.get("metrics"), dict) or (
        isinstance(doc.get("buckets"), list) and isinstance(doc.get("candidates"), dict))


def kind_of(doc: Any) -> str | None:
    """``results``, ``plan``, ``analysis`` or None (none of them)."""
    if not isinstance(doc, dict):
        return None
    fmt = str(doc.get("format", ""))
    if fmt.startswith("quantscope.analysis/"):
        return "analysis"
    if fmt.startswith("quantscope.plan/") or ("default" in doc and "groups" in doc):
        return "plan"
    results = doc.get("results")
    if _is_result(doc) or (isinstance(results, dict) and results
                           and all(isinstance(r, dict) and _is_result(r)
                                   for r in results.values())):
        return "results"
    return None


def require_kind(doc: Any, want: str, path: str) -> dict[str, Any]:
    """``doc`` when it is a ``want`` file, else one line saying what it is."""
    found = kind_of(doc)
    if found == want:
        if want == "analysis":
            _check_analysis(doc, path)
        return doc
    if found is None:
        what = _run_file(doc)
        raise QuantscopeError(f"'{path}' given to {OPTION[want]} is "
                              + (f"{what}, not {ACCEPTS[want]}" if what else
                                 f"no quantscope {want} file: give {ACCEPTS[want]}"))
    raise QuantscopeError(f"'{path}' given to {OPTION[want]} is a {found} file: give it "
                          f"with {OPTION[found]}")


ACCEPTS = {"results": "a demo or evaluate JSON (a run's evaluate.json)",
           "plan": "a plan JSON (a run's plan.json or repaired.plan.json)",
           "analysis": "an analysis JSON (a run's analysis.json)"}


def _run_file(doc: Any) -> str | None:
    """What another file of a run folder is (its verdict, check, device I/O), else None."""
    if not isinstance(doc, dict):
        return None
    if "reached" in doc and "quality" in doc and "compiler_files" in doc:
        return "a run's verdict (its report is the report.html beside it)"
    fmt = str(doc.get("format", ""))
    for prefix, what in (("quantscope.check/", "a check result"),
                         ("quantscope.io/", "a device I/O file")):
        if fmt.startswith(prefix):
            return what
    return None


def _check_analysis(doc: dict[str, Any], path: str) -> None:
    """The analysis parses as one (its reader is strict), so no section comes out empty."""
    from quantscope.analyze import analysis_from_dict

    try:
        analysis_from_dict(doc)
    except QuantscopeError as exc:
        raise QuantscopeError(f"'{path}': {exc}: run 'quantscope analyze' again") from None
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise QuantscopeError(f"analysis '{path}' is incomplete or malformed "
                              f"({type(exc).__name__}): run 'quantscope analyze' again") from None


def results_of(doc: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    """Label -> result of a demo JSON (its table) or of one evaluate result."""
    return dict(doc["results"]) if "results" in doc else {label: doc}


def check_io_options(*, model: bool, stats: bool, plan: bool) -> None:
    """The device I/O and legality sections need the model, its stats and the plan."""
    given = {"--model": model, "--stats": stats, "--plan": plan}
    if any((model, stats)) and not all(given.values()):
        missing = [k for k, v in given.items() if not v]
        raise QuantscopeError(f"the device I/O section needs --model, --stats and --plan: "
                              f"add {' and '.join(missing)}, or leave out --model/--stats")
