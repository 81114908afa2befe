//! Results of a suite run: every sample, tables per workload and metric with ratio columns
//! against kernel ext4, JSON, and an SVG plot of each rate against the number of workers.

use super::targets::Kind;
use crate::CliResult;
use rext4::StatsReport;
use serde::{Serialize, Serializer};
use std::fmt::Write as _;

/// Whether more of a metric is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    Higher,
    Lower,
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Sample {
    pub workload: &'static str,
    pub target: &'static str,
    pub workers: usize,
    pub metric: String,
    pub unit: &'static str,
    pub better: Better,
    pub value: f64,
    /// A total time for work that grows with the workers (each does the same amount).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub per_worker_work: bool,
    /// Which repetition this is (0-based).
    pub run: usize,
    /// Anything more (latency lists, top five, engine commit times).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

/// One figure a workload reports.
pub(crate) struct Metric {
    pub name: String,
    pub unit: &'static str,
    pub better: Better,
    pub value: f64,
    pub per_worker_work: bool,
    pub extra: Option<serde_json::Value>,
}

/// What one workload run on one target with one worker count reports.
#[derive(Default)]
pub(crate) struct Out {
    pub metrics: Vec<Metric>,
    pub notes: Vec<String>,
}

impl Out {
    fn push(&mut self, name: &str, unit: &'static str, better: Better, value: f64, per_worker_work: bool) {
        self.metrics.push(Metric {
            name: name.to_string(),
            unit,
            better,
            value,
            per_worker_work,
            extra: None,
        });
    }
    /// A rate (more is better).
    pub(crate) fn rate(&mut self, metric: &str, unit: &'static str, v: f64) {
        self.push(metric, unit, Better::Higher, v, false);
    }
    /// A time or latency (less is better).
    pub(crate) fn time(&mut self, metric: &str, unit: &'static str, v: f64) {
        self.push(metric, unit, Better::Lower, v, false);
    }
    /// The total time of work each worker does the same amount of (so the work grows with
    /// the workers; the scaling row compares throughput).
    pub(crate) fn total_time(&mut self, metric: &str, v: f64) {
        self.push(metric, "s", Better::Lower, v, true);
    }
    /// Attaches detail to the last metric.
    pub(crate) fn extra(&mut self, v: serde_json::Value) {
        if let Some(m) = self.metrics.last_mut() {
            m.extra = Some(v);
        }
    }
}

/// Everything a suite run produced.
#[derive(Default, Serialize)]
pub(crate) struct Results {
    pub samples: Vec<Sample>,
    pub notes: Vec<String>,
    /// The in-process engine's statistics per workload (`rext4 stats` format).
    #[serde(serialize_with = "engine_stats_json")]
    pub engine_stats: Vec<(&'static str, StatsReport)>,
    pub machine: Machine,
}

/// `[workload, report]` pairs, each report as `rext4 stats --json` writes it.
fn engine_stats_json<S: Serializer>(v: &[(&'static str, StatsReport)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::Error;
    let v = v
        .iter()
        .map(|(wl, r)| Ok((*wl, serde_json::from_str(&rext4_cli::stats::json(r)).map_err(S::Error::custom)?)))
        .collect::<Result<Vec<(&str, serde_json::Value)>, S::Error>>()?;
    v.serialize(s)
}

#[derive(Default, Serialize)]
pub(crate) struct Machine {
    pub cpus: usize,
    pub kernel: String,
    pub quick: bool,
    pub tiny: bool,
}

impl Results {
    pub(crate) fn add(&mut self, workload: &'static str, kind: Kind, workers: usize, run: usize, out: Out) {
        for m in out.metrics {
            self.samples.push(Sample {
                workload,
                target: kind.name(),
                workers,
                metric: m.name,
                unit: m.unit,
                better: m.better,
                value: m.value,
                per_worker_work: m.per_worker_work,
                run,
                extra: m.extra,
            });
        }
        for n in out.notes {
            self.note(format!("{workload} / {}: {n}", kind.name()));
        }
    }

    pub(crate) fn note(&mut self, n: String) {
        if !self.notes.contains(&n) {
            self.notes.push(n);
        }
    }

    /// The median over runs of one cell.
    fn value(&self, workload: &str, metric: &str, target: &str, workers: usize) -> Option<f64> {
        let mut v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| {
                s.workload == workload && s.metric == metric && s.target == target && s.workers == workers
            })
            .map(|s| s.value)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    /// (workload, metric, unit, better) in the order they were first measured.
    fn tables(&self) -> Vec<(&'static str, String, &'static str, Better)> {
        let mut t: Vec<(&'static str, String, &'static str, Better)> = Vec::new();
        for s in &self.samples {
            if !t.iter().any(|x| x.0 == s.workload && x.1 == s.metric) {
                t.push((s.workload, s.metric.clone(), s.unit, s.better));
            }
        }
        t
    }

    fn targets_of(&self, workload: &str, metric: &str) -> Vec<Kind> {
        Kind::ALL
            .into_iter()
            .filter(|k| {
                self.samples
                    .iter()
                    .any(|s| s.workload == workload && s.metric == metric && s.target == k.name())
            })
            .collect()
    }

    fn workers_of(&self, workload: &str, metric: &str) -> Vec<usize> {
        let mut w: Vec<usize> = self
            .samples
            .iter()
            .filter(|s| s.workload == workload && s.metric == metric)
            .map(|s| s.workers)
            .collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// One table per workload and metric: a column per target, then each target's speed
    /// relative to kernel ext4 (>1: faster than the kernel), then FUSE against fuse2fs.
    pub(crate) fn print_tables(&self) {
        let mut last = "";
        for (workload, metric, unit, better) in self.tables() {
            if workload != last {
                println!("\n== {workload} ==");
                last = workload;
            }
            let targets = self.targets_of(workload, &metric);
            let kernel = targets.contains(&Kind::Kernel);
            let both_fuse = targets.contains(&Kind::Fuse) && targets.contains(&Kind::Fuse2fs);
            let ceiling = targets.contains(&Kind::Fuse) && targets.contains(&Kind::FuseMem);
            // The io_uring transport against /dev/fuse reads, and against its own ceiling.
            let pairs: Vec<(Kind, Kind)> = [
                (Kind::FuseUring, Kind::Fuse),
                (Kind::FuseUring, Kind::FuseMemUring),
                (Kind::FuseMemUring, Kind::FuseMem),
            ]
            .into_iter()
            .filter(|(a, b)| targets.contains(a) && targets.contains(b))
            .collect();
            // Over NBD: each NBD target against the local image file, and the default
            // connections against one.
            let nbd: Vec<Kind> = if targets.contains(&Kind::InProc) {
                targets.iter().copied().filter(|k| k.is_nbd()).collect()
            } else {
                Vec::new()
            };
            let conns: Vec<(Kind, Kind)> = [(Kind::NbdUnix, Kind::NbdUnix1), (Kind::NbdTcp, Kind::NbdTcp1)]
                .into_iter()
                .filter(|(a, b)| targets.contains(a) && targets.contains(b))
                .collect();
            let dir = if better == Better::Higher { "higher is better" } else { "lower is better" };
            println!(
                "{metric} ({unit}, {dir}); ratios are speed against {} (>1 = faster)",
                if kernel || nbd.is_empty() { "kernel ext4" } else { "the named target" }
            );
            let mut head = format!("{:>7}", "workers");
            for k in &targets {
                write!(head, " {:>11}", k.name()).ok();
            }
            if kernel {
                for k in targets.iter().filter(|k| **k != Kind::Kernel) {
                    write!(head, " {:>11}", format!("{}/kern", short(*k))).ok();
                }
            }
            if both_fuse {
                write!(head, " {:>12}", "fuse/fuse2fs").ok();
            }
            if ceiling {
                write!(head, " {:>12}", "fuse/fmem").ok();
            }
            for (a, b) in &pairs {
                write!(head, " {:>12}", format!("{}/{}", short(*a), short(*b))).ok();
            }
            for k in &nbd {
                write!(head, " {:>12}", format!("{}/inproc", short(*k))).ok();
            }
            for (a, b) in &conns {
                write!(head, " {:>11}", format!("{}/{}", short(*a), short(*b))).ok();
            }
            println!("{head}");
            for w in self.workers_of(workload, &metric) {
                let mut line = format!("{w:>7}");
                let val = |k: Kind| self.value(workload, &metric, k.name(), w);
                for &k in &targets {
                    write!(line, " {:>11}", val(k).map_or("-".into(), fmt_value)).ok();
                }
                let speed = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) if a > 0.0 && b > 0.0 => {
                        let r = if better == Better::Higher { a / b } else { b / a };
                        format!("{r:.2}x")
                    }
                    _ => "-".into(),
                };
                if kernel {
                    for &k in targets.iter().filter(|k| **k != Kind::Kernel) {
                        write!(line, " {:>11}", speed(val(k), val(Kind::Kernel))).ok();
                    }
                }
                if both_fuse {
                    write!(line, " {:>12}", speed(val(Kind::Fuse), val(Kind::Fuse2fs))).ok();
                }
                if ceiling {
                    write!(line, " {:>12}", speed(val(Kind::Fuse), val(Kind::FuseMem))).ok();
                }
                for &(a, b) in &pairs {
                    write!(line, " {:>12}", speed(val(a), val(b))).ok();
                }
                for &k in &nbd {
                    write!(line, " {:>12}", speed(val(k), val(Kind::InProc))).ok();
                }
                for &(a, b) in &conns {
                    write!(line, " {:>11}", speed(val(a), val(b))).ok();
                }
                println!("{line}");
            }
            // No collapse as workers grow: each target's throughput at its most workers
            // against its fewest, and the seeds' checks beside it: 2 workers against 1
            // (scaling on two cores) and the most against 2 (not lower) (not for latencies).
            let ws = self.workers_of(workload, &metric);
            let per_worker = self
                .samples
                .iter()
                .any(|s| s.workload == workload && s.metric == metric && s.per_worker_work);
            if let (Some(&lo), Some(&hi)) = (ws.first(), ws.last()) {
                let mut pairs = vec![(lo, hi)];
                if ws.contains(&2) && lo < 2 && hi > 2 {
                    pairs.extend([(lo, 2), (2, hi)]);
                }
                for (lo, hi) in
                    pairs.into_iter().filter(|_| hi > lo && (better == Better::Higher || per_worker))
                {
                    let mut line = format!("{:>7}", format!("{hi}w/{lo}w"));
                    for &k in &targets {
                        let r = match (
                            self.value(workload, &metric, k.name(), lo),
                            self.value(workload, &metric, k.name(), hi),
                        ) {
                            (Some(a), Some(b)) if a > 0.0 && b > 0.0 => {
                                let r =
                                    if better == Better::Higher { b / a } else { a / b * (hi / lo) as f64 };
                                format!("{r:.2}x")
                            }
                            _ => "-".into(),
                        };
                        write!(line, " {r:>11}").ok();
                    }
                    println!("{line}   (scaling: throughput at {hi} workers over {lo})");
                }
            }
        }
        if !self.notes.is_empty() {
            println!("\nnotes:");
            for n in &self.notes {
                println!("  {n}");
            }
        }
    }

    pub(crate) fn write_json(&self, path: &std::path::Path) -> CliResult {
        let s = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Every rate metric (`.../s`), one panel each: value against workers (log scale), a line
    /// per target.
    pub(crate) fn svg(&self) -> String {
        let panels: Vec<_> = self.tables().into_iter().filter(|t| t.2.ends_with("/s")).collect();
        let (pw, ph, cols) = (380.0, 260.0, 3usize);
        let rows = panels.len().div_ceil(cols).max(1);
        let (w, h) = (pw * cols as f64, ph * rows as f64 + 30.0);
        let mut s = String::new();
        writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
        )
        .ok();
        writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#).ok();
        writeln!(
            s,
            r#"<text x="10" y="20" font-size="14">rext4-bench: rates against workers, per target</text>"#
        )
        .ok();
        for (i, (workload, metric, unit, _)) in panels.iter().enumerate() {
            let (x0, y0) = ((i % cols) as f64 * pw, 30.0 + (i / cols) as f64 * ph);
            self.panel(&mut s, x0, y0, pw, ph, workload, metric, unit);
        }
        s.push_str("</svg>\n");
        s
    }

    #[allow(clippy::too_many_arguments)]
    fn panel(
        &self,
        s: &mut String,
        x0: f64,
        y0: f64,
        pw: f64,
        ph: f64,
        workload: &str,
        metric: &str,
        unit: &str,
    ) {
        let (l, r, t, b) = (x0 + 60.0, x0 + pw - 90.0, y0 + 25.0, y0 + ph - 35.0);
        let workers = self.workers_of(workload, metric);
        let targets = self.targets_of(workload, metric);
        let vals: Vec<f64> = targets
            .iter()
            .flat_map(|k| workers.iter().filter_map(|&w| self.value(workload, metric, k.name(), w)))
            .collect();
        let ymax = nice_max(vals.iter().copied().fold(0.0, f64::max));
        let (wmin, wmax) = (
            workers.first().copied().unwrap_or(1).max(1) as f64,
            workers.last().copied().unwrap_or(1).max(1) as f64,
        );
        let xspan = (wmax.log2() - wmin.log2()).max(1.0);
        let x = |w: usize| l + ((w.max(1) as f64).log2() - wmin.log2()) / xspan * (r - l);
        let y = |v: f64| b - v / ymax * (b - t);
        writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="12" font-weight="bold">{workload}: {metric} ({unit})</text>"#,
            x0 + 10.0,
            y0 + 15.0
        )
        .ok();
        writeln!(
            s,
            r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            r - l,
            b - t
        )
        .ok();
        for i in 0..=4 {
            let v = ymax * i as f64 / 4.0;
            writeln!(s, r##"<line x1="{l}" y1="{0}" x2="{r}" y2="{0}" stroke="#eee"/>"##, y(v)).ok();
            writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                l - 4.0,
                y(v) + 4.0,
                fmt_axis(v)
            )
            .ok();
        }
        for &w in &workers {
            writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{w}</text>"#, x(w), b + 14.0).ok();
        }
        writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">workers</text>"#, (l + r) / 2.0, b + 28.0)
            .ok();
        for (j, k) in targets.iter().enumerate() {
            let pts: Vec<String> = workers
                .iter()
                .filter_map(|&w| {
                    self.value(workload, metric, k.name(), w).map(|v| format!("{:.1},{:.1}", x(w), y(v)))
                })
                .collect();
            let c = color(*k);
            if pts.len() > 1 {
                writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
                    pts.join(" ")
                )
                .ok();
            }
            for p in &pts {
                let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
                writeln!(s, r#"<circle cx="{px}" cy="{py}" r="3" fill="{c}"/>"#).ok();
            }
            let ly = t + 12.0 + j as f64 * 15.0;
            writeln!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/>"#,
                r + 8.0,
                r + 24.0
            )
            .ok();
            writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, r + 28.0, ly + 4.0, k.name()).ok();
        }
    }
}

fn short(k: Kind) -> &'static str {
    match k {
        Kind::InProc => "inproc",
        Kind::NbdUnix => "nbdU",
        Kind::NbdUnix1 => "nbdU1",
        Kind::NbdTcp => "nbdT",
        Kind::NbdTcp1 => "nbdT1",
        Kind::Fuse => "fuse",
        Kind::Kernel => "kern",
        Kind::Fuse2fs => "f2fs",
        Kind::Tmpfs => "tmpfs",
        Kind::FuseMem => "fmem",
        Kind::FuseUring => "fuseU",
        Kind::FuseMemUring => "fmemU",
    }
}

fn color(k: Kind) -> &'static str {
    match k {
        Kind::InProc => "#d62728",
        Kind::NbdUnix => "#8c564b",
        Kind::NbdUnix1 => "#c49c94",
        Kind::NbdTcp => "#e377c2",
        Kind::NbdTcp1 => "#f7b6d2",
        Kind::Fuse => "#ff7f0e",
        Kind::Kernel => "#1f77b4",
        Kind::Fuse2fs => "#7f7f7f",
        Kind::Tmpfs => "#2ca02c",
        Kind::FuseMem => "#9467bd",
        Kind::FuseUring => "#ffbb78",
        Kind::FuseMemUring => "#c5b0d5",
    }
}

/// A round axis maximum above `v`.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * p).find(|&m| m >= v).unwrap_or(10.0 * p)
}

/// An axis label: 250k, 1.5M.
fn fmt_axis(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{}k", v / 1e3)
    } else {
        fmt_value(v)
    }
}

/// A value in a few significant digits.
pub(crate) fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 || a == 0.0 {
        format!("{v:.0}")
    } else {
        // Three significant digits.
        let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_three_digits() {
        assert_eq!(fmt_value(0.000123456), "0.000123");
        assert_eq!(fmt_value(1.5), "1.50");
        assert_eq!(fmt_value(123.4), "123");
        assert_eq!(fmt_value(98765.0), "98765");
        assert_eq!(fmt_value(2.5e6), "2.50M");
    }

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(180.0), 200.0);
        assert_eq!(nice_max(2400.0), 2500.0);
    }

    #[test]
    fn svg_has_a_panel_per_rate_and_a_line_per_target() {
        let mut r = Results::default();
        for (k, f) in [(Kind::InProc, 2.0), (Kind::Kernel, 1.0)] {
            for w in [1, 2, 8] {
                let mut o = Out::default();
                o.rate("create", "ops/s", f * 1000.0 * w as f64);
                o.total_time("total", 1.0);
                r.add("mdtest", k, w, 0, o);
            }
        }
        let svg = r.svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("mdtest: create (ops/s)"));
        assert!(!svg.contains("total"));
        assert_eq!(r.value("mdtest", "create", "inproc", 8), Some(16000.0));
    }
}
