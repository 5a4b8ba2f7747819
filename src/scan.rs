//! `lock-janitor scan` and `lock-janitor label`.
use std::process::ExitCode;

use crate::cli::{LabelArgs, ScanArgs};

pub async fn scan_command(_args: ScanArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("scan is not implemented yet")
}

pub async fn label_command(_args: LabelArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("label is not implemented yet")
}
