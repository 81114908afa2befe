//! The engine's statistics ([`rext4::StatsReport`]) as `rext4 stats` shows them: operations in
//! seed 000's style (FUNC, TOTAL_TIME(us), COUNT, AVG(us)), then lock waits per lock class and
//! journal commit times (mean, stddev, top 5, as seed 003 reports them); or as JSON.

use rext4::StatsReport;
use std::fmt::Write as _;

/// The three tables, operations by total time, only what was used.
pub fn tables(r: &StatsReport) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_tables(&mut s, r);
    s
}

fn write_tables(s: &mut String, r: &StatsReport) -> std::fmt::Result {
    let mut ops: Vec<_> = r.ops.iter().filter(|o| o.count > 0).collect();
    ops.sort_by_key(|o| std::cmp::Reverse(o.total_ns));
    if r.every > 1 {
        writeln!(s, "(operations: estimated from one top-level operation in {} per thread)", r.every)?;
    }
    writeln!(s, "{:<34} {:>16} {:>12} {:>12}", "FUNC", "TOTAL_TIME(us)", "COUNT", "AVG(us)")?;
    for o in ops {
        let us = o.total_ns as f64 / 1e3;
        writeln!(s, "{:<34} {:>16.0} {:>12} {:>12.2}", o.name, us, o.count, us / o.count as f64)?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "{:<38} {:>12} {:>10} {:>14} {:>10} {:>12}",
        "LOCK", "ACQUIRED", "WAITED", "WAIT_TIME(us)", "AVG(us)", "MAX(us)"
    )?;
    for l in r.locks.iter().filter(|l| l.acquired > 0) {
        let us = l.wait_ns as f64 / 1e3;
        let avg = if l.contended > 0 { us / l.contended as f64 } else { 0.0 };
        writeln!(
            s,
            "{:<38} {:>12} {:>10} {:>14.0} {:>10.2} {:>12.1}",
            l.name,
            l.acquired,
            l.contended,
            us,
            avg,
            l.max_wait_ns as f64 / 1e3
        )?;
    }
    writeln!(s)?;
    let p = &r.page_cache;
    writeln!(
        s,
        "page cache: {} pages ({:.1} MiB); {} misses, {} of them reading ahead; {} reads past it, {} more spliced from the image; {} blocks set aside for appends",
        p.pages,
        p.bytes as f64 / (1 << 20) as f64,
        p.misses,
        p.readahead,
        p.direct_reads,
        p.spliced_reads,
        r.reserved_blocks
    )?;
    let w = &r.writeback;
    writeln!(
        s,
        "writeback: {} dirty pages in {} files, {} blocks reserved for them; {} blocks written back in {} writebacks ({:.1} ms); {} writers throttled; {} flusher rounds",
        w.dirty_pages,
        w.dirty_files,
        w.delalloc_blocks,
        w.written_blocks,
        w.writebacks,
        w.writeback_ns as f64 / 1e6,
        w.throttled,
        w.flusher_rounds
    )?;
    match &r.commits {
        Some(c) if c.commits > 0 => {
            let top: Vec<String> = c.top5_us.iter().map(|t| format!("{:.6}s", *t as f64 / 1e6)).collect();
            writeln!(
                s,
                "journal commits: {}, mean {:.6}s, stddev {:.6}s, max {:.6}s; top 5: {}",
                c.commits,
                c.mean_us / 1e6,
                c.stddev_us / 1e6,
                c.max_us as f64 / 1e6,
                top.join(", ")
            )?;
            writeln!(
                s,
                "journal blocks: {} logged for {} handles ({:.3} a handle), {} written home by checkpoints",
                c.blocks,
                c.handles,
                c.blocks as f64 / c.handles.max(1) as f64,
                c.checkpoint_blocks
            )?;
            if c.slow == 0 {
                return Ok(());
            }
            writeln!(
                s,
                "journal commits over 1 ms: {}, {} of them preempted while committing, {:.3} ms waiting for handles",
                c.slow,
                c.slow_preempted,
                c.slow_drain_us as f64 / 1e3
            )
        }
        Some(_) => writeln!(s, "journal commits: none yet"),
        None => writeln!(s, "journal commits: none (read-only)"),
    }
}

/// The report as a JSON object: `ops` and `locks` (every row, used or not, with the engine's
/// field names), `commits` (an object, or null when read-only) and `every`.
pub fn json(r: &StatsReport) -> String {
    let mut s = String::from("{\n  \"ops\": [");
    for (i, o) in r.ops.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            s,
            "{sep}\n    {{\"name\": {}, \"count\": {}, \"total_ns\": {}}}",
            string(o.name),
            o.count,
            o.total_ns
        );
    }
    s.push_str("\n  ],\n  \"locks\": [");
    for (i, l) in r.locks.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            s,
            "{sep}\n    {{\"name\": {}, \"acquired\": {}, \"contended\": {}, \"wait_ns\": {}, \"max_wait_ns\": {}}}",
            string(l.name),
            l.acquired,
            l.contended,
            l.wait_ns,
            l.max_wait_ns
        );
    }
    s.push_str("\n  ],\n  \"commits\": ");
    match &r.commits {
        Some(c) => {
            let top: Vec<String> = c.top5_us.iter().map(u64::to_string).collect();
            let _ = write!(
                s,
                "{{\"commits\": {}, \"mean_us\": {}, \"stddev_us\": {}, \"max_us\": {}, \"top5_us\": [{}], \"handles\": {}, \"blocks\": {}, \"checkpoint_blocks\": {}, \"slow\": {}, \"slow_preempted\": {}, \"slow_drain_us\": {}}}",
                c.commits,
                number(c.mean_us),
                number(c.stddev_us),
                c.max_us,
                top.join(", "),
                c.handles,
                c.blocks,
                c.checkpoint_blocks,
                c.slow,
                c.slow_preempted,
                c.slow_drain_us
            );
        }
        None => s.push_str("null"),
    }
    let p = &r.page_cache;
    let _ = write!(
        s,
        ",\n  \"page_cache\": {{\"pages\": {}, \"bytes\": {}, \"misses\": {}, \"readahead\": {}, \"direct_reads\": {}, \"spliced_reads\": {}}}",
        p.pages, p.bytes, p.misses, p.readahead, p.direct_reads, p.spliced_reads
    );
    let _ = write!(s, ",\n  \"reserved_blocks\": {}", r.reserved_blocks);
    let w = &r.writeback;
    let _ = write!(
        s,
        ",\n  \"writeback\": {{\"dirty_pages\": {}, \"dirty_files\": {}, \"delalloc_blocks\": {}, \"written_blocks\": {}, \"writebacks\": {}, \"writeback_ns\": {}, \"throttled\": {}, \"flusher_rounds\": {}}}",
        w.dirty_pages, w.dirty_files, w.delalloc_blocks, w.written_blocks, w.writebacks, w.writeback_ns, w.throttled, w.flusher_rounds
    );
    let _ = write!(s, ",\n  \"every\": {}\n}}", r.every);
    s
}

/// A JSON string.
fn string(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// A JSON number; JSON has no NaN or infinity, so those are null.
fn number(v: f64) -> String {
    if v.is_finite() {
        // `{:?}` keeps a fraction (`2.0`), so readers see a float.
        format!("{v:?}")
    } else {
        "null".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rext4::{CommitSummary, LockStat, OpStat, PageCacheStats, WritebackStats};

    fn report() -> StatsReport {
        StatsReport {
            ops: vec![
                OpStat { name: "ext4_create", count: 3, total_ns: 4500 },
                OpStat { name: "ext4_unlink", count: 0, total_ns: 0 },
            ],
            locks: vec![LockStat { name: "x\"y", acquired: 5, contended: 1, wait_ns: 10, max_wait_ns: 10 }],
            commits: Some(CommitSummary {
                commits: 2,
                mean_us: 1.5,
                stddev_us: f64::NAN,
                max_us: 2,
                top5_us: vec![2, 1],
                handles: 7,
                blocks: 5,
                checkpoint_blocks: 3,
                slow: 1,
                slow_preempted: 1,
                slow_drain_us: 250,
            }),
            every: 16,
            page_cache: PageCacheStats {
                pages: 4,
                bytes: 16384,
                misses: 3,
                readahead: 1,
                direct_reads: 2,
                spliced_reads: 5,
            },
            reserved_blocks: 12,
            writeback: WritebackStats {
                dirty_pages: 9,
                dirty_files: 2,
                delalloc_blocks: 7,
                written_blocks: 30,
                writebacks: 4,
                writeback_ns: 1000,
                throttled: 1,
                flusher_rounds: 3,
            },
        }
    }

    #[test]
    fn json_holds_every_field() {
        let v: serde_json::Value = serde_json::from_str(&json(&report())).unwrap();
        assert_eq!(v["ops"][0]["name"], "ext4_create");
        assert_eq!(v["ops"][0]["count"], 3);
        assert_eq!(v["ops"][0]["total_ns"], 4500);
        assert_eq!(v["ops"].as_array().unwrap().len(), 2, "unused rows too");
        assert_eq!(v["locks"][0]["name"], "x\"y");
        for (k, want) in [("acquired", 5), ("contended", 1), ("wait_ns", 10), ("max_wait_ns", 10)] {
            assert_eq!(v["locks"][0][k], want, "{k}");
        }
        let c = &v["commits"];
        assert_eq!(c["mean_us"].as_f64(), Some(1.5));
        assert!(c["stddev_us"].is_null(), "NaN is not JSON");
        assert_eq!(c["top5_us"], serde_json::json!([2, 1]));
        for (k, want) in [
            ("commits", 2),
            ("max_us", 2),
            ("handles", 7),
            ("blocks", 5),
            ("checkpoint_blocks", 3),
            ("slow", 1),
            ("slow_preempted", 1),
            ("slow_drain_us", 250),
        ] {
            assert_eq!(c[k], want, "{k}");
        }
        assert_eq!(v["every"], 16);
        let p = &v["page_cache"];
        for (k, want) in [
            ("pages", 4),
            ("bytes", 16384),
            ("misses", 3),
            ("readahead", 1),
            ("direct_reads", 2),
            ("spliced_reads", 5),
        ] {
            assert_eq!(p[k], want, "{k}");
        }
        assert_eq!(v["reserved_blocks"], 12);
        let w = &v["writeback"];
        for (k, want) in [
            ("dirty_pages", 9),
            ("dirty_files", 2),
            ("delalloc_blocks", 7),
            ("written_blocks", 30),
            ("writebacks", 4),
            ("writeback_ns", 1000),
            ("throttled", 1),
            ("flusher_rounds", 3),
        ] {
            assert_eq!(w[k], want, "{k}");
        }
        let ro = StatsReport { commits: None, ..report() };
        let v: serde_json::Value = serde_json::from_str(&json(&ro)).unwrap();
        assert!(v["commits"].is_null());
        let empty = StatsReport { ops: vec![], locks: vec![], commits: None, every: 1, ..report() };
        assert!(serde_json::from_str::<serde_json::Value>(&json(&empty)).is_ok());
    }

    #[test]
    fn tables_show_what_was_used() {
        let t = tables(&report());
        assert!(t.contains("one top-level operation in 16"), "{t}");
        assert!(t.contains("ext4_create") && !t.contains("ext4_unlink"), "{t}");
        assert!(
            t.contains("journal commits: 2,") && t.contains("journal blocks: 5 logged for 7 handles"),
            "{t}"
        );
        assert!(t.contains("page cache: 4 pages") && t.contains("12 blocks set aside"), "{t}");
        assert!(
            t.contains("commits over 1 ms: 1, 1 of them preempted while committing, 0.250 ms waiting"),
            "{t}"
        );
        let quick = tables(&StatsReport {
            commits: Some(CommitSummary { slow: 0, ..report().commits.unwrap() }),
            ..report()
        });
        assert!(!quick.contains("over 1 ms"), "{quick}");
        let ro = tables(&StatsReport { commits: None, ..report() });
        assert!(ro.ends_with("journal commits: none (read-only)\n"), "{ro}");
    }
}
