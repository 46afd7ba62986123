//! The benchmark: every figure next to a comparator measured in the same run, over several
//! runs; a table on stdout, JSON in `--out`. See `e2e::bench` and `scripts/bench.sh`.
//!
//! Exits non-zero only when a measurement could not be taken, never for a missed target.

#![allow(clippy::print_stdout)] // the table on stdout is this tool's output

use clap::Parser;
use e2e::bench::{Args, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let (Some(file), Some(out)) = (&args.prepare_image, &args.prepared_out) {
        println!("{}", e2e::bench::perceive::prepare_child(file, out)?);
        return Ok(());
    }
    let report = run(&args).await?;
    print!("{}", report.table());
    report.write_json(&args.out)?;
    if !report.instrumented() {
        eprintln!("surface latency: not instrumented (no `mxbridge_latency` lines in its log)");
    }
    eprintln!("JSON report: {}", args.out.display());
    Ok(())
}
