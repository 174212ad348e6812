//! The evidence harness: every figure pyramid shows is measured by it, on a named
//! machine and commit, with the route that really ran and a check that its tokens were
//! right.
//!
//! - [`energy`]: joules from RAPL (powercap), net of an idle baseline, or the reason
//!   there are none.
//! - [`results`]: the results file (`benchmarks/latest.json`): `verified` cells with
//!   provenance, `_unverified` figures kept apart, and the checks `pyramid bench check`
//!   runs.
//! - [`matrix`]: the benchmark matrix's configuration and its cells in interleaved order.
//! - [`peers`]: side-by-side runs against llama.cpp and OpenVINO GenAI, admitted when
//!   measured here from a committed tree.
//! - [`report`]: Markdown tables and SVG and PNG charts rendered from verified figures only.

pub mod energy;
pub mod matrix;
pub mod peers;
pub mod report;
pub mod results;
