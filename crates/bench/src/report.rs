//! Markdown tables and charts (SVG, and PNG rendered from the same SVG) from a results
//! file's verified cells. Cells that are
//! not headline (wrong tokens, or run on another device than asked) appear only in their
//! own failures table; unverified figures never appear.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::energy::EnergyReport;
use crate::results::{Cell, PeerComparison, Provenance, ReplayRecord, ResultsFile};

/// Cells of one chart and table: same model, weights, cache, batch and token counts.
type GroupKey = (String, String, String, usize, usize, usize);
type Group<'a> = BTreeMap<GroupKey, Vec<&'a Cell>>;

/// Headline cells of real models, grouped; synthetic cells go to the scaling table.
fn groups(file: &ResultsFile) -> Group<'_> {
    let mut groups: Group<'_> = BTreeMap::new();
    for c in file
        .verified
        .iter()
        .filter(|c| c.is_headline() && !c.synthetic)
    {
        let k = &c.key;
        groups
            .entry((
                k.model.clone(),
                k.precision.clone(),
                k.kv.clone(),
                k.batch,
                k.n_prompt,
                k.n_gen,
            ))
            .or_default()
            .push(c);
    }
    groups
}

/// Headline synthetic cells, smallest model first.
fn scaling_cells(file: &ResultsFile) -> Vec<&Cell> {
    let mut cells: Vec<&Cell> = file
        .verified
        .iter()
        .filter(|c| c.is_headline() && c.synthetic)
        .collect();
    cells.sort_by_key(|c| (c.parameters, c.key.clone()));
    cells
}

/// How speed falls with model size: one row per synthetic cell.
fn scaling_table(cells: &[&Cell], full: bool) -> String {
    let mut out = String::from("| model (random weights) | parameters | weights | window | route | batch | prefill tok/s | decode tok/s |");
    if full {
        out.push_str(" decode ms/tok | TTFT ms | process peak RSS MiB |");
    }
    out.push_str("\n|---|---:|---|---:|---|---:|---:|---:|");
    if full {
        out.push_str("---:|---:|---:|");
    }
    out.push('\n');
    for c in cells {
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            c.key.model.trim_start_matches("synthetic:"),
            c.parameters
                .map_or("—".to_string(), |n| format!("{:.2} B", n as f64 / 1e9)),
            c.key.precision,
            c.key.window,
            c.key.route(),
            c.key.batch
        );
        if full {
            let _ = writeln!(
                out,
                " {:.1} ± {:.1} | {:.1} ± {:.1} | {:.1} | {:.0} | {} |",
                c.prefill_tok_s.mean,
                c.prefill_tok_s.sd,
                c.decode_tok_s.mean,
                c.decode_tok_s.sd,
                c.decode_ms_per_token.mean,
                c.ttft_ms.mean,
                c.peak_rss_bytes.map_or("n/a".to_string(), |b| format!(
                    "{:.0}",
                    b as f64 / (1u64 << 20) as f64
                ))
            );
        } else {
            let _ = writeln!(
                out,
                " {:.1} | {:.1} |",
                c.prefill_tok_s.mean, c.decode_tok_s.mean
            );
        }
    }
    out
}

fn title(g: &GroupKey) -> String {
    format!(
        "{} — {} weights, {} KV, batch {}, {} prompt + {} generated tokens",
        g.0, g.1, g.2, g.3, g.4, g.5
    )
}

/// Every run behind the figures: machine, commit, date and command, once each.
fn provenance_list(file: &ResultsFile) -> String {
    let all = file
        .verified
        .iter()
        .filter_map(|c| c.provenance.as_ref())
        .chain(file.replays.iter().filter_map(|r| r.provenance.as_ref()))
        .chain(file.peers.iter().filter_map(|p| p.provenance.as_ref()));
    let mut runs: Vec<&Provenance> = Vec::new();
    for p in all {
        if !runs
            .iter()
            .any(|r| (&r.commit, &r.date) == (&p.commit, &p.date))
        {
            runs.push(p);
        }
    }
    runs.sort_by(|a, b| a.date.cmp(&b.date));
    let mut out = String::from("\nRuns behind these figures:\n\n");
    for p in runs {
        let _ = writeln!(
            out,
            "- {}: {} ({} kernels, {} cores, {:.0} GiB), commit `{}`: `{}`",
            p.date,
            p.machine.cpu,
            p.machine.isa,
            p.machine.cores,
            p.machine.memory_bytes as f64 / (1u64 << 30) as f64,
            &p.commit[..p.commit.len().min(10)],
            p.command
        );
    }
    out
}

/// Route × window table of one figure.
fn table(cells: &[&Cell], figure: &str, value: impl Fn(&Cell) -> String) -> String {
    let mut windows: Vec<usize> = cells.iter().map(|c| c.key.window).collect();
    windows.sort_unstable();
    windows.dedup();
    let mut routes: Vec<String> = cells.iter().map(|c| c.key.route()).collect();
    routes.sort();
    routes.dedup();
    let mut out = format!("| {figure} |");
    for w in &windows {
        let _ = write!(out, " w{w} |");
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(windows.len()));
    out.push('\n');
    for r in &routes {
        let _ = write!(out, "| {r} |");
        for w in &windows {
            let v = cells
                .iter()
                .find(|c| &c.key.route() == r && c.key.window == *w)
                .map_or("—".to_string(), |c| value(c));
            let _ = write!(out, " {v} |");
        }
        out.push('\n');
    }
    out
}

fn energy_cell(c: &Cell) -> String {
    match (&c.energy, c.joules_per_token) {
        (_, Some(j)) => format!("{:.3} J/tok", j),
        (EnergyReport::Unavailable(_), None) => "unavailable".to_string(),
        (EnergyReport::Measured(_), None) => "n/a".to_string(),
    }
}

/// The full report: every group's tables, chart references, and the failures.
pub fn markdown(file: &ResultsFile, chart_dir: Option<&str>) -> String {
    let mut out = String::from("# Benchmark report\n\nGenerated by `pyramid bench report` from the verified cells of the results file; every figure is a mean ± sd over the cell's repetitions, measured by the harness on the machine and commit its provenance names.\n");
    out.push_str(&provenance_list(file));
    for (i, (g, cells)) in groups(file).iter().enumerate() {
        let _ = write!(out, "\n## {}\n\n", title(g));
        if let Some(dir) = chart_dir {
            let _ = writeln!(
                out,
                "![decode throughput against window]({dir}/decode-{i}.svg)\n"
            );
        }
        out.push_str(&table(cells, "decode tok/s", |c| {
            format!("{:.1} ± {:.1}", c.decode_tok_s.mean, c.decode_tok_s.sd)
        }));
        out.push('\n');
        out.push_str(&table(cells, "prefill tok/s", |c| {
            format!("{:.1} ± {:.1}", c.prefill_tok_s.mean, c.prefill_tok_s.sd)
        }));
        out.push('\n');
        out.push_str(&table(cells, "TTFT ms", |c| {
            format!("{:.0} ± {:.0}", c.ttft_ms.mean, c.ttft_ms.sd)
        }));
        out.push('\n');
        out.push_str(&table(cells, "compile ms", |c| {
            format!("{:.0}", c.compile_ms)
        }));
        out.push('\n');
        out.push_str(&table(cells, "energy", energy_cell));
        let reasons: Vec<&str> = cells
            .iter()
            .filter_map(|c| match &c.energy {
                EnergyReport::Unavailable(r) => Some(r.as_str()),
                EnergyReport::Measured(_) => None,
            })
            .collect();
        if let Some(r) = reasons.first() {
            let _ = writeln!(out, "\nEnergy unavailable: {r}.");
        }
    }
    let scaling = scaling_cells(file);
    if let Some(c) = scaling.first() {
        let _ = write!(
            out,
            "\n## Scaling with model size (synthetic weights: speed only)\n\nRandom weights with the exact shapes of published models, {} prompt + {} generated tokens; their tokens mean nothing, so they are neither qualified nor quality results. Peak RSS is the harness process's during the cell, with every model of its matrix loaded.\n\n",
            c.key.n_prompt, c.key.n_gen
        );
        out.push_str(&scaling_table(&scaling, true));
    }
    if !file.peers.is_empty() {
        out.push_str("\n## Side by side with llama.cpp and OpenVINO GenAI\n\nMeasured by `scripts/peers/bench-peers.sh` (engines alternating within each repetition, same GGUF file, threads and lengths); tok/s mean ± sd, ratios of means.\n\n");
        out.push_str(&peers_table(&file.peers, true));
    }
    let replays: Vec<&ReplayRecord> = file.replays.iter().filter(|r| r.is_headline()).collect();
    if !replays.is_empty() {
        out.push_str("\n## Window strategies (`pyramid replay`)\n\nThe same agent trace under each strategy: the largest window from the start, re-prefill into a larger window on overflow, and the window pyramid migrating its KV cache on demand or with the next window compiled ahead (predictive).\n");
    }
    for (i, r) in replays.iter().enumerate() {
        let _ = write!(out, "\n### {}\n\n", replay_title(r));
        if let Some(dir) = chart_dir {
            let _ = writeln!(out, "![total time per strategy]({dir}/replay-{i}.svg)\n");
        }
        out.push_str("| arm | total ms | TTFT p50 ms | decode ms/tok | compile ms (n) | migration ms (n) | re-prefill ms (n) | stall ms (n) | peak RSS MiB | failed sessions |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for a in &r.arms {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.1} | {:.0} ({}) | {:.0} ({}) | {:.0} ({}) | {:.0} ({}) | {} | {} |",
                a.arm,
                a.total_ms,
                a.ttft_ms_p50,
                a.decode_ms_per_token,
                a.compile_ms,
                a.n_compiles,
                a.migration_ms,
                a.n_migrations,
                a.reprefill_ms,
                a.n_reprefills,
                a.stall_ms,
                a.n_stalls,
                a.peak_rss_bytes
                    .map_or("n/a".to_string(), |b| format!("{:.0}", b as f64 / (1u64 << 20) as f64)),
                a.failed_sessions
            );
        }
        let _ = writeln!(
            out,
            "\nTokens identical across arms: {}. Executed: {}.",
            match r.tokens_identical {
                Some(true) => "yes",
                Some(false) => "no",
                None => "n/a (one arm)",
            },
            r.executed
        );
    }
    let failed_replays: Vec<&ReplayRecord> =
        file.replays.iter().filter(|r| !r.is_headline()).collect();
    for r in failed_replays {
        let _ = writeln!(
            out,
            "\nReplay kept out of the tables ({}): {}; executed {}.",
            if !r.as_requested {
                "ran on another device than asked"
            } else if r.tokens_identical == Some(false) {
                "arms generated different tokens"
            } else {
                "sessions failed"
            },
            replay_title(r),
            r.executed
        );
    }
    let failures: Vec<&Cell> = file.verified.iter().filter(|c| !c.is_headline()).collect();
    if !failures.is_empty() {
        out.push_str("\n## Failures (kept out of the tables above)\n\n| model | weights | window | route | executed | tokens | agreement with f32 | prefill tok/s | decode tok/s |\n|---|---|---:|---|---|---|---|---:|---:|\n");
        for c in failures {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} -> {} | {} | {} | {:.1} | {:.1} |",
                c.key.model,
                c.key.precision,
                c.key.window,
                c.key.route(),
                c.prefill_executed,
                c.decode_executed,
                match c.qualified {
                    Some(false) => "wrong",
                    Some(true) => "right",
                    None => "unchecked",
                },
                c.agreement.map_or("—".to_string(), |a| a.to_string()),
                c.prefill_tok_s.mean,
                c.decode_tok_s.mean
            );
        }
    }
    out
}

const PEERS: [(&str, &str); 3] = [
    ("llama-q8_0", "llama.cpp Q8_0"),
    ("llama-own", "llama.cpp own quant"),
    ("ov-genai", "OV GenAI"),
];

/// Model × test rows: pyramid's tok/s, each peer's, and pyramid's ratio to each.
fn peers_table(peers: &[PeerComparison], with_sd: bool) -> String {
    let mut out = String::from("| model | test | threads | pyramid |");
    for (_, name) in PEERS {
        let _ = write!(out, " {name} |");
    }
    for (_, name) in PEERS {
        let _ = write!(out, " pyramid / {name} |");
    }
    out.push_str("\n|---|---|---:|---:|");
    out.push_str(&"---:|".repeat(2 * PEERS.len()));
    out.push('\n');
    let figure = |p: &PeerComparison, engine: &str| match p.figure(engine) {
        Some(f) => match (f.mean_ts, f.sd_ts) {
            (Some(m), Some(sd)) if with_sd => format!("{m:.1} ± {sd:.1}"),
            (Some(m), _) => format!("{m:.1}"),
            (None, _) => "failed".to_string(),
        },
        None => "—".to_string(),
    };
    for p in peers {
        let _ = write!(
            out,
            "| {} | {} | {} | {} ({}{}) |",
            p.model,
            p.test,
            p.threads,
            figure(p, "pyramid"),
            p.precision,
            if p.kv == "f32" {
                String::new()
            } else {
                format!(", KV {}", p.kv)
            }
        );
        for (engine, _) in PEERS {
            let _ = write!(out, " {} |", figure(p, engine));
        }
        for (engine, _) in PEERS {
            let _ = write!(
                out,
                " {} |",
                p.ratio(engine)
                    .map_or("—".to_string(), |r| format!("{r:.2}×"))
            );
        }
        out.push('\n');
    }
    let failures: Vec<String> = peers
        .iter()
        .flat_map(|p| {
            p.engines.iter().filter_map(move |f| {
                f.error
                    .as_ref()
                    .map(|e| format!("- {} {} {}: {}", p.model, p.test, f.engine, e))
            })
        })
        .collect();
    if with_sd && !failures.is_empty() {
        let _ = write!(out, "\nFailed:\n{}\n", failures.join("\n"));
    }
    out
}

fn replay_title(r: &ReplayRecord) -> String {
    format!(
        "{} — {} weights, {} KV, route {}, windows {:?}: {} ({} steps, {} appended + {} generated tokens)",
        r.model,
        r.precision,
        r.kv,
        r.route,
        r.windows,
        r.trace,
        r.steps,
        r.appended_tokens,
        r.generate_tokens
    )
}

/// The README's performance section: decode throughput of every headline group, and
/// the total time of each window strategy.
pub fn readme_section(file: &ResultsFile) -> String {
    let mut out = String::from(
        "Decode tok/s by window and route, measured by `pyramid bench matrix`, and agent traces replayed by `pyramid replay --record` (full report, charts and failures: docs/bench/REPORT.md).\n",
    );
    for (g, cells) in groups(file) {
        let _ = write!(out, "\n**{}**\n\n", title(&g));
        out.push_str(&table(&cells, "decode tok/s", |c| {
            format!("{:.1}", c.decode_tok_s.mean)
        }));
    }
    let scaling = scaling_cells(file);
    if !scaling.is_empty() {
        out.push_str("\n**Scaling with model size** (synthetic weights with published shapes: speed only)\n\n");
        out.push_str(&scaling_table(&scaling, false));
    }
    if !file.peers.is_empty() {
        out.push_str("\n**Side by side** (tok/s; `scripts/peers/bench-peers.sh`)\n\n");
        out.push_str(&peers_table(&file.peers, false));
    }
    for r in file.replays.iter().filter(|r| r.is_headline()) {
        let _ = write!(out, "\n**{}**\n\n| arm | total s | decode ms/tok | re-prefill s | stalls |\n|---|---:|---:|---:|---:|\n", replay_title(r));
        for a in &r.arms {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:.1} | {} |",
                a.arm,
                a.total_ms / 1e3,
                a.decode_ms_per_token,
                a.reprefill_ms / 1e3,
                a.n_stalls
            );
        }
    }
    out
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// A rendered chart and the file stem the report links it under.
pub struct Chart {
    pub name: String,
    pub svg: String,
}

/// Every chart of the report: decode throughput per group, total time per replay.
pub fn charts(file: &ResultsFile) -> Vec<Chart> {
    let decode = decode_charts(file)
        .into_iter()
        .enumerate()
        .map(|(i, svg)| Chart {
            name: format!("decode-{i}"),
            svg,
        });
    let replays = file
        .replays
        .iter()
        .filter(|r| r.is_headline())
        .enumerate()
        .map(|(i, r)| Chart {
            name: format!("replay-{i}"),
            svg: replay_chart(r),
        });
    let peers = (!file.peers.is_empty()).then(|| Chart {
        name: "peers".to_string(),
        svg: peers_chart(&file.peers),
    });
    decode.chain(replays).chain(peers).collect()
}

/// Bars of pyramid's throughput over each peer's, per model and test, against parity.
fn peers_chart(peers: &[PeerComparison]) -> String {
    let (w, left, right, top, row_h) = (700.0, 250.0, 50.0, 60.0, 54.0);
    let h = top + peers.len() as f64 * row_h + 50.0;
    let max = peers
        .iter()
        .flat_map(|p| PEERS.iter().filter_map(|(e, _)| p.ratio(e)))
        .fold(1.0, f64::max)
        * 1.1;
    let x = |r: f64| left + r / max * (w - left - right);
    let colors = ["#1f77b4", "#2ca02c", "#ff7f0e"];
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><text x="10" y="20" font-size="13">pyramid throughput / peer throughput (same run, same file)</text>"#
    );
    for (i, ((_, name), color)) in PEERS.iter().zip(colors).enumerate() {
        let lx = 10.0 + i as f64 * 170.0;
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="32" width="12" height="12" fill="{color}"/><text x="{}" y="42">{}</text>"#,
            lx + 16.0,
            escape(name)
        );
    }
    for (i, p) in peers.iter().enumerate() {
        let y0 = top + i as f64 * row_h;
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y0 + row_h / 2.0,
            escape(&format!("{} {} ({})", p.model, p.test, p.precision))
        );
        for (j, ((engine, _), color)) in PEERS.iter().zip(colors).enumerate() {
            let y = y0 + 4.0 + j as f64 * 15.0;
            match p.ratio(engine) {
                Some(r) => {
                    let _ = write!(
                        svg,
                        r#"<rect x="{left}" y="{y}" width="{:.1}" height="13" fill="{color}"/><text x="{:.1}" y="{}" font-size="11">{r:.2}×</text>"#,
                        x(r) - left,
                        x(r) + 4.0,
                        y + 11.0
                    );
                }
                None => {
                    let _ = write!(
                        svg,
                        r#"<text x="{}" y="{}" font-size="11">no figure</text>"#,
                        left + 4.0,
                        y + 11.0
                    );
                }
            }
        }
    }
    let bottom = h - 40.0;
    let _ = write!(
        svg,
        r#"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{bottom}" stroke="black" stroke-dasharray="4 3"/><text x="{0:.1}" y="{1}" text-anchor="middle">1× (parity)</text>"#,
        x(1.0),
        bottom + 16.0
    );
    svg.push_str("</svg>\n");
    svg
}

/// Horizontal bars of each arm's total time, split into re-prefill, stall and the rest.
fn replay_chart(r: &ReplayRecord) -> String {
    let (w, left, right, top, bar_h, gap) = (640.0, 90.0, 70.0, 50.0, 26.0, 12.0);
    let h = top + r.arms.len() as f64 * (bar_h + gap) + 60.0;
    let max = r
        .arms
        .iter()
        .map(|a| a.total_ms)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.05;
    let x = |ms: f64| left + ms / max * (w - left - right);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        svg,
        r#"<text x="10" y="20" font-size="13">{} — total time per strategy</text>"#,
        escape(&format!("{} {} on {}", r.model, r.precision, r.route))
    );
    let parts = [
        ("re-prefill", "#d62728"),
        ("stall", "#ff7f0e"),
        ("rest", "#1f77b4"),
    ];
    for (i, (label, color)) in parts.iter().enumerate() {
        let lx = left + i as f64 * 110.0;
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="30" width="12" height="12" fill="{color}"/><text x="{}" y="40">{label}</text>"#,
            lx + 16.0
        );
    }
    for (i, a) in r.arms.iter().enumerate() {
        let y = top + i as f64 * (bar_h + gap);
        let rest = (a.total_ms - a.reprefill_ms - a.stall_ms).max(0.0);
        let mut at = 0.0;
        for (ms, (_, color)) in [a.reprefill_ms, a.stall_ms, rest].into_iter().zip(parts) {
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{y}" width="{:.1}" height="{bar_h}" fill="{color}"/>"#,
                x(at),
                x(at + ms) - x(at)
            );
            at += ms;
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><text x="{:.1}" y="{}">{:.1} s</text>"#,
            left - 6.0,
            y + bar_h / 2.0 + 4.0,
            escape(&a.arm),
            x(a.total_ms) + 4.0,
            y + bar_h / 2.0 + 4.0,
            a.total_ms / 1e3
        );
    }
    let _ = write!(
        svg,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><text x="{}" y="{}" text-anchor="middle">total time (s); same tokens in every arm</text>"#,
        h - 40.0,
        w - right,
        h - 40.0,
        (left + w - right) / 2.0,
        h - 16.0
    );
    svg.push_str("</svg>\n");
    svg
}

/// One SVG line chart per group: decode tok/s against window (log₂ axis), a line per route.
fn decode_charts(file: &ResultsFile) -> Vec<String> {
    groups(file)
        .iter()
        .map(|(g, cells)| {
            let (w, h, left, right, top, bottom) = (640.0, 380.0, 60.0, 170.0, 40.0, 50.0);
            let mut windows: Vec<usize> = cells.iter().map(|c| c.key.window).collect();
            windows.sort_unstable();
            windows.dedup();
            let max_y = cells.iter().map(|c| c.decode_tok_s.mean).fold(0.0, f64::max) * 1.1;
            let (lo, hi) = (
                (windows[0] as f64).log2(),
                (*windows.last().unwrap() as f64).log2(),
            );
            let x = |win: usize| {
                let t = if hi > lo { ((win as f64).log2() - lo) / (hi - lo) } else { 0.5 };
                left + t * (w - left - right)
            };
            let y = |v: f64| top + (1.0 - v / max_y.max(1e-9)) * (h - top - bottom);
            let mut svg = format!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
            );
            let _ = write!(svg, r#"<text x="{left}" y="20" font-size="13">{}</text>"#, escape(&title(g)));
            let _ = write!(
                svg,
                r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
                h - bottom,
                w - right,
                h - bottom,
                h - bottom
            );
            for &win in &windows {
                let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{win}</text>"#, x(win), h - bottom + 16.0);
            }
            let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="middle">window (positions)</text>"#, (left + w - right) / 2.0, h - 12.0);
            for i in 0..=4 {
                let v = max_y * i as f64 / 4.0;
                let _ = write!(svg, r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#, left - 6.0, y(v) + 4.0);
            }
            let _ = write!(svg, r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">decode tok/s</text>"#, (top + h - bottom) / 2.0, (top + h - bottom) / 2.0);
            let mut routes: Vec<String> = cells.iter().map(|c| c.key.route()).collect();
            routes.sort();
            routes.dedup();
            for (i, route) in routes.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let mut points: Vec<(usize, f64)> = cells
                    .iter()
                    .filter(|c| &c.key.route() == route)
                    .map(|c| (c.key.window, c.decode_tok_s.mean))
                    .collect();
                points.sort_by_key(|p| p.0);
                let path: Vec<String> = points.iter().map(|&(win, v)| format!("{:.1},{:.1}", x(win), y(v))).collect();
                let _ = write!(svg, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, path.join(" "));
                for &(win, v) in &points {
                    let _ = write!(svg, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, x(win), y(v));
                }
                let ly = top + 16.0 * i as f64;
                let _ = write!(
                    svg,
                    r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                    w - right + 10.0,
                    w - right + 30.0,
                    w - right + 36.0,
                    ly + 4.0,
                    escape(route)
                );
            }
            svg.push_str("</svg>\n");
            svg
        })
        .collect()
}

/// `s` as SVG or XML text.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Why a chart could not be rendered as PNG.
#[derive(Debug, thiserror::Error)]
pub enum PngError {
    #[error("no system font for the chart text (install one, e.g. fonts-dejavu-core)")]
    NoFont,
    #[error("chart is not valid SVG: {0}")]
    Svg(String),
    #[error("PNG encoding: {0}")]
    Encode(String),
}

/// The PNG of an SVG chart, on white, at its own size. One source for both formats, so
/// the two can never show different figures.
pub fn png_of_svg(svg: &str) -> Result<Vec<u8>, PngError> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    // The charts ask for "sans-serif", which fontdb maps to Arial: point it at a sans
    // face this machine has.
    let family = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"]
        .into_iter()
        .map(str::to_string)
        .find(|want| {
            fonts
                .faces()
                .any(|f| f.families.iter().any(|(name, _)| name == want))
        })
        .or_else(|| {
            fonts
                .faces()
                .find_map(|f| f.families.first().map(|(name, _)| name.clone()))
        })
        .ok_or(PngError::NoFont)?;
    fonts.set_sans_serif_family(family);
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| PngError::Svg(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| PngError::Svg("empty canvas".to_string()))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| PngError::Encode(e.to_string()))
}
