"""Benchmark: how well each proposer and patching method recovers circuits known by construction (issue 34).

Reads a report of `python -m core benchmark` (the committed docs/benchmark/report.json by default):
the head- and edge-recovery tables (ROC AUC with its interval over seeds, PR AUC, precision@k, each
beside its permutation baseline; edges also between heads only), the published ACDC anchors (other models, never mixed in), the
ROC curves of one model, the disposer's verdict accuracy, and any method's proposal opened in the
ablation lab on its model.
"""

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from core.errors import HeadLabError
from core.figures.benchmark import cell_text, roc_figure, score_table_figure
from core.heads import parse_heads
from core.model.loading import load_config
from core.model.refs import ModelRef
from core.pipelines.benchmark import QUICK, BenchmarkSettings, benchmark, known_cases, n_items, run_case
from core.pipelines.benchmark_report import HEAD_TO_HEAD
from core.workspace import atomic_write_json, reports_dir, zoo_dir
from pages._state import HAND_OFF_NOTE, HEADS_MODEL, MODEL, current_workspace, send_to_ablation_lab, set_choice
from pages._widgets import show_figure

REPO = Path(__file__).resolve().parents[1]
REPORTS = {"full (committed)": REPO / "docs" / "benchmark" / "report.json",
           "quick (committed)": REPO / "docs" / "benchmark" / "quick" / "report.json"}
OTHER = "another report.json"
RUN_HERE = "quick (run here)"  # the report the Run button writes under $HEADLAB_HOME
REPORT_KEYS = ("table", "results", "methods", "verdicts")  # what the page reads; a file without them is not a report
MEASURE_COLUMNS = (("roc_auc", "ROC AUC"), ("average_precision", "PR AUC"), ("precision_at_k", "precision@k"))
ABLATION_MODE = "ablation_mode"  # the ablation lab's "Ablation" selectbox
SEND_KEY = "bench_send"


def read_report(path: Path) -> dict:
    """The benchmark report at `path`, or HeadLabError saying what is wrong with the file and what to do."""
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise HeadLabError(f"no benchmark report at {path}; run python -m core benchmark --out FOLDER "
                           "(or --quick) and give FOLDER/report.json.") from None
    except (OSError, ValueError) as exc:
        raise HeadLabError(f"cannot read the benchmark report {path} ({exc}); give a report.json that "
                           "python -m core benchmark wrote.") from None
    missing = [k for k in REPORT_KEYS if not isinstance(report, dict) or k not in report]
    if missing:
        raise HeadLabError(f"{path} is not a benchmark report (it lacks {', '.join(missing)}); give a report.json "
                           "that python -m core benchmark wrote.")
    return report


def recovery_table(report: dict, level: str) -> pd.DataFrame:
    """One row per (method, task): each measure's mean [interval over seeds] beside its random baseline."""
    rows = {}
    for r in report["table"]:
        if r.get("level", "head") != level:
            continue
        row = rows.setdefault((r["method"], r["task"]), {"method": r["method"], "task": r["task"],
                                                         "seeds": r.get("n_seeds")})
        label = dict(MEASURE_COLUMNS).get(r["measure"])
        if label is None:
            continue
        row[label] = cell_text(r)
        row[f"{label} random"] = r.get("baseline_mean")
        if r["measure"] == "roc_auc":
            row["ROC AUC max p"] = r.get("max_p")
            row["not applicable"] = "; ".join(r.get("not_applicable") or [])
    return pd.DataFrame(list(rows.values()))


def verdict_table(report: dict) -> pd.DataFrame:
    """The disposer's verdicts per kind of group, and how often they are right."""
    return pd.DataFrame([{"group": kind, "groups": v.get("n"), "expected": v.get("expected") or "(not judged)",
                          "verdicts": ", ".join(f"{k} {n}" for k, n in sorted(v.get("verdicts", {}).items())),
                          "right": v.get("correct"), "judged": v.get("n_judged"), "accuracy": v.get("rate")}
                         for kind, v in report["verdicts"].items()])


def proposals(report: dict) -> dict[str, dict]:
    """"method · model" -> the proposal's model, heads, ablation type and token range, for every non-empty proposal."""
    found = {}
    for result in report["results"]:
        case = result["case"]
        for entry in result["methods"]:
            if entry.get("proposal"):
                found[f"{entry['method']} · {case['name']}"] = {
                    "model": case["model"], "heads": list(entry["proposal"]), "mode": case.get("mode"),
                    "truth": list(case.get("truth", [])), "pairs": case.get("pairs", {})}
    return found


def open_in_lab(choice: dict) -> None:
    """Button callback: the proposal's model in the sidebar, its heads in the ablation lab, its ablation type chosen.

    A model of a small vocabulary gets the induction probe over the benchmark's token range when the sidebar's
    probe cannot be read by it (send_to_ablation_lab says so on the lab's page).
    """
    pairs = choice["pairs"]
    token_range = (int(pairs["token_low"]), int(pairs["token_high"])) if "token_high" in pairs else _vocab_range(choice)
    send_to_ablation_lab(parse_heads(", ".join(choice["heads"])).heads,
                         vocab_size=token_range[1] if token_range else None, token_range=token_range)
    set_choice(MODEL, choice["model"])
    st.session_state[HEADS_MODEL] = choice["model"]  # picked on that model, not on the page's old workspace
    if choice.get("mode"):
        st.session_state[ABLATION_MODE] = choice["mode"]
    if pairs.get("task") not in (None, "known-induction"):
        note = st.session_state.get(HAND_OFF_NOTE, "")
        st.session_state[HAND_OFF_NOTE] = (f"These heads were scored on the benchmark's {pairs['task']} pairs; the lab "
                                           f"ablates them on the sidebar's probe. {note}").strip()


def _vocab_range(choice: dict) -> tuple[int, int] | None:
    """(0, vocabulary size) of the proposal's model from its config, or None when the config cannot be read."""
    try:
        return 0, int(load_config(ModelRef.parse(choice["model"])).vocab_size)
    except HeadLabError:
        return None


def run_path() -> Path:
    """Where the Run button writes its report: $HEADLAB_HOME/reports/benchmark-quick/report.json."""
    return reports_dir() / "benchmark-quick" / "report.json"


def run_quick() -> None:
    """The quick benchmark (hand-wired models, QUICK settings) with a progress bar; its report under run_path().

    Each case runs item by item (core caches every item), then `benchmark` assembles the report from the cache,
    so it equals `python -m core benchmark --quick`'s, and a stopped run resumes.
    """
    settings = BenchmarkSettings(**QUICK)
    with st.status("Running the quick benchmark...", expanded=True) as status:
        bar = st.progress(0.0, text="building the hand-wired models")
        cases, notes = known_cases(kinds=("handwired",), say=status.write)
        total, done = n_items(cases, settings), 0

        def tick(text: str) -> None:
            nonlocal done
            done += 1
            bar.progress(min(done / max(total, 1), 1.0), text=f"{done}/{total}: {text}")

        for case in cases:
            run_case(case, settings, tick=tick)
        report = benchmark(cases, settings, progress=False, quick=True)
        report["runtime"]["left_out"] = notes
        atomic_write_json(run_path(), report)
        status.update(label=f"Quick benchmark written to {run_path()}", state="complete", expanded=False)
    st.session_state["bench_report"] = RUN_HERE


def choose_report() -> tuple[str, dict | None]:
    """The report the user picked (path shown), or None after an error was shown."""
    left, right = st.columns([1, 2])
    if st.button("Run the quick benchmark here", key="bench_run", icon=":material/play_arrow:",
                 help="The hand-wired models with fewer pairs and controls (measured from a fresh HEADLAB_HOME: 57 s on an "
                      "idle 2-core machine, 165 s on a busy one; finished items are cached, so a stopped run resumes). Written under $HEADLAB_HOME/reports/benchmark-quick."):
        try:
            run_quick()
        except HeadLabError as exc:
            st.error(str(exc))
    choices = list(REPORTS) + ([RUN_HERE] if run_path().is_file() else []) + [OTHER]
    which = left.radio("Report", choices, key="bench_report")
    if which == RUN_HERE:
        path = run_path()
        right.caption(f"`{path}`")
    elif which == OTHER:
        text = right.text_input("Path of a report.json", key="bench_path",
                                placeholder="e.g. ~/bench/report.json (python -m core benchmark --out ~/bench)")
        if not text.strip():
            st.info("Give the path of a report.json that python -m core benchmark --out FOLDER wrote.")
            return "", None
        path = Path(text.strip()).expanduser()
    else:
        path = REPORTS[which]
        right.caption(f"`{path.relative_to(REPO)}`")
    try:
        return str(path), read_report(path)
    except HeadLabError as exc:
        st.error(str(exc))
        return str(path), None


def show(report: dict) -> None:
    st.caption(f"{len(report['results'])} known models · {'quick' if report.get('quick') else 'full'} run · "
               f"{report.get('baseline', '')}; {report.get('interval', '')}.")
    head_tab, edge_tab, between_tab = st.tabs(["Head recovery", "Edge recovery", "Edges between heads"])
    for tab, level in ((head_tab, "head"), (edge_tab, "edge"), (between_tab, HEAD_TO_HEAD)):
        with tab:
            table = recovery_table(report, level)
            if table.empty:
                st.info(f"This report has no {level} scores.")
                continue
            if level == HEAD_TO_HEAD:
                st.caption("The same edge scores on the edges between two heads only: a planted circuit's truth "
                           "names the head-to-head edges it planted and those its confirmation measured, and nothing "
                           "of the embeddings', MLPs' and logits' edges its heads also use, which the full graph "
                           "counts as false.")
            st.dataframe(table, hide_index=True, width="stretch", key=f"bench_table_{level}")
            measure = st.selectbox("Heatmap of", [m for m, _ in MEASURE_COLUMNS], key=f"bench_measure_{level}",
                                   format_func=lambda m: dict(MEASURE_COLUMNS)[m])
            show_figure(score_table_figure(report, measure, level), key=f"bench_heat_{level}")
    published = report.get("published", {})
    if published.get("rows"):
        st.markdown(f"**Published anchors**: {published.get('label', 'published numbers on other models')}")
        st.dataframe(pd.DataFrame(published["rows"]), hide_index=True, width="stretch", key="bench_published")

    st.subheader("ROC curves")
    names = [r["case"]["name"] for r in report["results"]]
    model = st.selectbox("Model", names, key="bench_roc_model")
    show_figure(roc_figure(report, [model]), key="bench_roc")

    st.subheader("The disposer's verdicts")
    st.caption(report.get("disposer", ""))
    st.dataframe(verdict_table(report), hide_index=True, width="stretch", key="bench_verdicts")

    st.subheader("Open a proposal in the ablation lab")
    found = proposals(report)
    if not found:
        st.info("No method made a proposal in this report.")
        return
    s1, s2 = st.columns([3, 1], vertical_alignment="bottom")
    label = s1.selectbox("Proposal (method · model)", list(found), key=SEND_KEY)
    choice = found[label]
    built = (zoo_dir() / choice["model"]).is_dir()
    s2.button("Open in the ablation lab", key="bench_open", icon=":material/science:", disabled=not built,
              on_click=open_in_lab, args=(choice,),
              help="The model goes into the sidebar, the heads into the lab's head box, the circuit's ablation type "
                   "into the lab's Ablation choice.")
    hits = len(set(choice["heads"]) & set(choice["truth"]))
    st.caption(f"heads {', '.join(choice['heads'])} · true circuit {', '.join(choice['truth'])} · {hits} of "
               f"{len(choice['heads'])} proposed heads are true · ablation type {choice['mode']}")
    if not built:
        st.warning(f"{choice['model']} is not in the zoo ({zoo_dir()}); build it with `python -m core known "
                   f"--build {choice['model']}`, then open it here.")


st.title("Known-circuit benchmark")
current_workspace()  # this page reads reports, not the workspace, but the sidebar (and its errors) still shows
st.caption("Every proposer and patching method scored against circuits known by construction: hand-wired and "
           "planted models with their true heads and edges. The published ACDC numbers are on other models and are "
           "shown for scale, never as HeadLab results.")
path, report = choose_report()
if report is not None:
    try:
        show(report)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        st.error(f"{path} does not read as a benchmark report ({type(exc).__name__}: {exc}); give a report.json "
                 "that python -m core benchmark wrote.")
    except HeadLabError as exc:
        st.error(str(exc))
