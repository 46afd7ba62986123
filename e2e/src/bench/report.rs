//! The report: every figure over the runs next to its comparator, the ratio, the target, the
//! verdict and, for a miss, a hint; printed as one table and written as JSON.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Sizes;
use super::figures::{Fig, RunFigures, Stat};
use super::hints::{Medians, clue, hint};
use super::machine::MachineInfo;
use super::stats::{Spread, Verdict, num, ratios, spread_text};

/// One figure's values over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Values {
    /// Per run, in run order (`null` where a run has no value).
    pub runs: Vec<Option<f64>>,
    /// Min, median and max of the runs that have a value.
    pub spread: Option<Spread>,
}

impl Values {
    fn new(runs: Vec<Option<f64>>) -> Self {
        let present: Vec<f64> = runs.iter().flatten().copied().collect();
        Self {
            spread: Spread::of(&present),
            runs,
        }
    }

    fn median(&self) -> Option<f64> {
        self.spread.map(|s| s.median)
    }
}

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Stable key.
    pub key: String,
    /// Label.
    pub figure: String,
    /// Unit of `this` and `comparator`.
    pub unit: String,
    /// This project (or the machine).
    pub this: Values,
    /// What it is compared with, if anything.
    pub comparator_name: Option<String>,
    /// The comparator's values.
    pub comparator: Option<Values>,
    /// `this / comparator` per run.
    pub ratio: Option<Values>,
    /// The target, as text.
    pub target: Option<String>,
    /// PASS or MISS, on the medians.
    pub verdict: Option<Verdict>,
    /// For a MISS: what the comparators say dominates.
    pub hint: Option<String>,
    /// Why there is no value (e.g. `not instrumented`).
    pub note: Option<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: MachineInfo,
    /// What was measured, how often.
    pub sizes: Sizes,
    /// Seconds the whole benchmark took.
    pub elapsed_s: f64,
    /// Every figure.
    pub figures: Vec<Row>,
}

/// Builds the rows from every run's figures.
pub fn rows(runs: &[RunFigures], sizes: &Sizes) -> Vec<Row> {
    let figs = Fig::all();
    let column = |f: Fig, other: bool| -> Vec<Option<f64>> {
        runs.iter()
            .map(|r| r.get(&f).and_then(|s| if other { s.other } else { s.this }))
            .collect()
    };
    let medians: Medians = figs
        .iter()
        .map(|&f| {
            let m = |other| Values::new(column(f, other)).median();
            (f, (m(false), m(true)))
        })
        .collect();
    figs.into_iter()
        .map(|f| {
            let spec = f.spec(sizes.rooms);
            let this = Values::new(column(f, false));
            let other = column(f, true);
            let has_other = other.iter().any(Option::is_some);
            let ratio = (has_other && spec.ratio).then(|| {
                Values::new(
                    ratios(&column(f, false), &other)
                        .into_iter()
                        .map(Some)
                        .collect(),
                )
            });
            let verdict = spec
                .target
                .and_then(|t| t.verdict(this.median(), ratio.as_ref().and_then(Values::median)));
            let hint = (verdict == Some(Verdict::Miss))
                .then(|| clue(f, &medians, sizes.size_mib as f64, sizes.rooms))
                .flatten()
                .map(|c| hint(&c));
            let note = match f {
                Fig::Surface(..)
                    if this.spread.is_none()
                        && sizes.phases.contains(&crate::bench::Phase::Latency) =>
                {
                    Some("not instrumented".to_owned())
                }
                _ if this.spread.is_none() => Some("not measured".to_owned()),
                _ => None,
            };
            Row {
                key: spec.key,
                figure: spec.label,
                unit: spec.unit.to_owned(),
                target: spec.target.map(|t| t.text(spec.unit, spec.comparator)),
                comparator_name: has_other.then(|| spec.comparator.to_owned()),
                comparator: has_other.then(|| Values::new(other)),
                this,
                ratio,
                verdict,
                hint,
                note,
            }
        })
        .collect()
}

impl Report {
    /// The table, one line per figure, with a header saying what was measured.
    pub fn table(&self) -> String {
        let header = [
            "figure",
            "unit",
            "this min/med/max",
            "comparator",
            "comp min/med/max",
            "ratio",
            "target",
            "verdict",
            "hint",
        ];
        let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
        for r in &self.figures {
            let cell = |v: &Option<Values>| {
                v.as_ref()
                    .and_then(|v| v.spread.as_ref())
                    .map(spread_text)
                    .unwrap_or_default()
            };
            let this = match (&r.this.spread, &r.note) {
                (Some(s), _) => spread_text(s),
                (None, Some(n)) => n.clone(),
                (None, None) => String::new(),
            };
            let ratio = r
                .ratio
                .as_ref()
                .and_then(|v| v.spread.as_ref())
                .map(|s| format!("{}×", num(s.median)))
                .unwrap_or_default();
            lines.push(vec![
                r.figure.clone(),
                r.unit.clone(),
                this,
                r.comparator_name.clone().unwrap_or_default(),
                cell(&r.comparator),
                ratio,
                r.target.clone().unwrap_or_default(),
                r.verdict.map(|v| v.as_str().to_owned()).unwrap_or_default(),
                r.hint.clone().unwrap_or_default(),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let s = &self.sizes;
        let mut out = format!(
            "mxbridge bench: {} run(s), file {} MiB, {} messages, {} rooms, {} replies per latency series \
             (paced: {} ms pause); {} CPUs, {} MiB RAM, temp dir on {}; {:.0} s\n",
            s.runs,
            s.size_mib,
            s.messages,
            s.rooms,
            s.rounds,
            s.pause_ms,
            self.machine.nproc,
            self.machine.mem_total_mib,
            self.machine.tmp_fs,
            self.elapsed_s,
        );
        for line in lines {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// Writes the JSON report to `path`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").with_context(|| format!("write {}", path.display()))
    }

    /// Whether the surface logged any latency samples.
    pub fn instrumented(&self) -> bool {
        self.figures.iter().any(|r| {
            r.key.starts_with("surface_")
                && r.key.ends_with(Stat::P50.as_str())
                && r.this.spread.is_some()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::figures::{Leg, Room, Sample};

    fn sizes() -> Sizes {
        Sizes::resolve(&crate::bench::Args::default_for_tests())
    }

    #[test]
    fn rows_carry_spreads_ratios_verdicts_and_hints() {
        let mut a = RunFigures::new();
        a.insert(Fig::Sha, Sample::alone(1000.0));
        a.insert(Fig::Inbound(Room::Plain), Sample::new(400.0, 1000.0));
        a.insert(Fig::InboundFsync(Room::Plain), Sample::new(400.0, 420.0));
        a.insert(Fig::OneRoom, Sample::new(90.0, 100.0));
        let mut b = a.clone();
        b.insert(Fig::Inbound(Room::Plain), Sample::new(500.0, 1000.0));
        let mut c = a.clone();
        c.insert(Fig::Inbound(Room::Plain), Sample::new(450.0, 1000.0));
        let rows = rows(&[a, b, c], &sizes());
        let row = |key: &str| rows.iter().find(|r| r.key == key).unwrap();

        let inbound = row("inbound_plain");
        let spread = inbound.this.spread.unwrap();
        assert_eq!(
            (spread.min, spread.median, spread.max),
            (400.0, 450.0, 500.0)
        );
        assert_eq!(inbound.ratio.as_ref().unwrap().spread.unwrap().median, 0.45);
        assert_eq!(inbound.verdict, Some(Verdict::Miss));
        assert!(
            inbound.hint.as_ref().unwrap().contains("fsync"),
            "{inbound:?}"
        );

        let one = row("throughput_one_room");
        assert_eq!(one.verdict, Some(Verdict::Pass));
        assert_eq!(one.hint, None);

        let sha = row("sha256");
        assert!(sha.comparator.is_none() && sha.verdict.is_none());

        let leg = row(&Fig::Surface(Leg::SyncToAgent, Stat::P99).spec(20).key);
        assert_eq!(leg.note.as_deref(), Some("not instrumented"));
        assert_eq!(leg.verdict, None);
    }

    #[test]
    fn the_table_has_a_line_per_figure_and_the_json_parses() {
        let mut a = RunFigures::new();
        a.insert(Fig::Outbound(Room::Encrypted), Sample::new(50.0, 100.0));
        let report = Report {
            machine: MachineInfo::read(),
            sizes: sizes(),
            elapsed_s: 1.0,
            figures: rows(&[a], &sizes()),
        };
        let table = report.table();
        assert_eq!(table.lines().count(), 2 + Fig::all().len());
        let line = table
            .lines()
            .find(|l| l.starts_with("outbound encrypted "))
            .unwrap();
        assert!(line.contains("0.5×") && line.contains("MISS"), "{line}");
        assert!(!report.instrumented());
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["figures"][0]["key"], "sha256");
        assert_eq!(json["sizes"]["runs"], 3);
    }
}
