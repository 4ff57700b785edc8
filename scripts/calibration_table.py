"""The simulator's calibration table for one round of `scripts/calibrate.sh`.

Reads a calibration directory (the core speeds measured before and after, the limited-link
benchmark's results and kept logs, the fit run and the default local swarm), writes each
calibration scenario with that round's core speed for its setting (the mean of the two
measurements) into DIR/scenarios, runs `iota-p2p simulate` on each, and prints live and
simulated tokens/s and merge durations side by side as a Markdown table, with their ratios.
The merge is the longest of an epoch, averaged over the epochs that opened with one, on both
sides (`scripts/merge_times.py`).

    python3 scripts/calibration_table.py DIR [BINARY]   # BINARY: target/debug/iota-p2p
"""
import json
import pathlib
import re
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import merge_times  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
# (label, scenario file, core-speed setting, where the live tokens/s is, kept-log directory)
ROWS = [
    ("`local-swarm --stages 2 --miners 4` (the fit's configuration)", "fit", "32", "fit", None),
    ("`local-swarm` (default, 127.0.0.1)", "local-swarm", "32", "local-swarm", "LOCAL"),
    ("100 Mbit/s, f32, no bottleneck", "wan-100mbit-f32", "0", ("wan-100mbit", "f32"), "100mbit-f32"),
    ("100 Mbit/s, default (32, bf16)", "wan-100mbit", "32", ("wan-100mbit", "default"), "100mbit-default"),
    ("100 Mbit/s, most compressed (1, bf16)", "wan-100mbit-best", "1", ("wan-100mbit", "best"), "100mbit-best"),
    ("1 Gbit/s, f32, no bottleneck", "wan-1gbit-f32", "0", ("wan-1gbit", "f32"), "1gbit-f32"),
    ("1 Gbit/s, default", "wan-1gbit", "32", ("wan-1gbit", "default"), "1gbit-default"),
    ("1 Gbit/s, most compressed", "wan-1gbit-best", "1", ("wan-1gbit", "best"), "1gbit-best"),
]


def core_speeds(directory):
    speeds = {}
    for name in ("cores-before.txt", "cores-after.txt"):
        for line in (directory / name).read_text().splitlines():
            m = re.search(r"bottleneck=(\d+) .*tokens_per_s=([\d.]+)", line)
            if m:
                speeds.setdefault(m.group(1), []).append(float(m.group(2)))
    return {k: statistics.mean(v) for k, v in speeds.items()}


def live_tokens(directory):
    found = {}
    for line in (directory / "wan.txt").read_text().splitlines():
        m = re.match(r"RESULT (wan-\w+) (.*)", line)
        if m and "loss" not in m.group(1):
            for k, v in re.findall(r"tokens_per_s_(\w+)=([\d.]+)", m.group(2)):
                found[(m.group(1), k)] = float(v)
    for run in ("fit", "local-swarm"):
        m = re.search(r"tokens_per_s=([\d.]+)", (directory / f"{run}.txt").read_text())
        found[run] = float(m.group(1)) if m else None
    return found


def live_merge(directory, logs, kept):
    if kept is None:
        return None
    run = directory / "local-swarm" if kept == "LOCAL" else logs / kept
    return merge_times.longest_mean(merge_times.merges(str(run)))


def scenario_text(name, speed):
    source = "local-swarm" if name == "fit" else name
    text = (ROOT / "scenarios" / f"{source}.toml").read_text()
    text = re.sub(r"(?m)^tokens_per_core_s = .*$", f"tokens_per_core_s = {speed:.0f}", text)
    if name == "fit":
        text = text.replace('name = "local-swarm"', 'name = "fit"', 1)
        text = re.sub(r"(?m)^count = 6$", "count = 4", text, count=1)
        text += "\n[run]\nstages = 2\n"
    return text


def simulate(binary, directory, name, speed):
    scenarios = directory / "scenarios"
    scenarios.mkdir(exist_ok=True)
    path = scenarios / f"{name}.toml"
    path.write_text(scenario_text(name, speed))
    out = directory / "simulated"
    subprocess.run([binary, "simulate", "--scenario", str(path), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    run = json.loads((out / f"{name}.json").read_text())["runs"][0]
    return run["tokens_per_s"], run["mean_merge_secs"]


def main(directory, binary):
    directory = pathlib.Path(directory)
    wan = (directory / "wan.txt").read_text()
    logs = pathlib.Path(re.search(r"node logs kept in (\S+)", wan).group(1))
    speeds = core_speeds(directory)
    tokens = live_tokens(directory)
    print("| setting | tokens/s live | simulated | ratio | merge s live | simulated | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, name, setting, live_key, kept in ROWS:
        sim_tokens, sim_merge = simulate(binary, directory, name, speeds[setting])
        live = tokens.get(live_key)
        merge = live_merge(directory, logs, kept)
        cells = [label, f"{live:,.0f}".replace(",", " "), f"{sim_tokens:,.0f}".replace(",", " "),
                 f"{sim_tokens / live:.2f}"]
        if merge is None:
            cells += ["", "", ""]
        else:
            cells += [f"{merge:.3f}", f"{sim_merge:.3f}", f"{sim_merge / merge:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print("\ncore speeds (tokens/s on one core, mean of before and after): "
          + ", ".join(f"bottleneck {k}: {v:.0f}" for k, v in sorted(speeds.items())))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "target/debug/iota-p2p"))
