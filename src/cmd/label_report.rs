//! What `label` reports: one row per lock candidate, what it did or would
//! do, and its `-o json|yaml` items (a [`LockList`] of [`LabeledItem`]s,
//! documented in docs/cli.md).

use serde::Serialize;

use super::report::{ItemHolder, ItemMeta, ItemSpec, API_VERSION};

/// What `label` did, or would do, to one lock candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelResult {
    /// Dry run: the label would be added.
    WouldLabel,
    Labeled,
    /// It already has the label.
    Unchanged,
    /// Its key has another value (an opt-out): never overwritten.
    Skipped,
    /// Deleted since it was read.
    Gone,
    /// Changed since it was read (409): not labeled.
    Conflict,
    Failed,
}

impl LabelResult {
    /// The word of the RESULT column and of `labeling.result`.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelResult::WouldLabel => "would-label",
            LabelResult::Labeled => "labeled",
            LabelResult::Unchanged => "unchanged",
            LabelResult::Skipped => "skipped",
            LabelResult::Gone => "gone",
            LabelResult::Conflict => "conflict",
            LabelResult::Failed => "failed",
        }
    }

    /// Labeled, or would be: what `-o name` prints.
    pub fn adds(self) -> bool {
        matches!(self, LabelResult::WouldLabel | LabelResult::Labeled)
    }
}

/// One line of `label`'s report. `-o json|yaml` prints it as a
/// [`LabeledItem`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRow {
    /// `configmap` or `lease`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub created_at: Option<String>,
    /// Matched `--selector` when read.
    pub labeled: bool,
    /// ConfigMap: its ownerReference's name; Lease: the host its holder
    /// identity names.
    pub holder: Option<String>,
    /// ConfigMap: its ownerReference's uid.
    pub holder_uid: Option<String>,
    pub result: LabelResult,
    /// The value it had under the label's key when read.
    pub current_value: Option<String>,
    /// What was done or found, in a sentence.
    pub message: String,
}

/// How many locks had each result.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LabelCounts {
    pub labeled: usize,
    #[serde(rename = "would-label")]
    pub would_label: usize,
    pub unchanged: usize,
    pub skipped: usize,
    pub gone: usize,
    pub conflict: usize,
    pub failed: usize,
}

impl LabelCounts {
    pub fn count(rows: &[LabelRow]) -> LabelCounts {
        let mut c = LabelCounts::default();
        for r in rows {
            *match r.result {
                LabelResult::Labeled => &mut c.labeled,
                LabelResult::WouldLabel => &mut c.would_label,
                LabelResult::Unchanged => &mut c.unchanged,
                LabelResult::Skipped => &mut c.skipped,
                LabelResult::Gone => &mut c.gone,
                LabelResult::Conflict => &mut c.conflict,
                LabelResult::Failed => &mut c.failed,
            } += 1;
        }
        c
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSummary {
    /// Without `--apply`: nothing was written.
    pub dry_run: bool,
    /// The `key=value` written (or that would be).
    pub label: String,
    /// Locks listed in `items`.
    pub total: usize,
    pub results: LabelCounts,
    /// Lock candidates left out by `--include`/`--exclude`.
    pub excluded: usize,
    pub skipped_with_data: usize,
    #[serde(rename = "configMapsScanned")]
    pub configmaps_scanned: usize,
    pub leases_scanned: usize,
    pub namespaces: Vec<String>,
    pub selector: String,
    pub duration_seconds: f64,
}

/// One lock of `label`'s [`LockList`]: the `metadata` and `spec` of a
/// [`LockItem`], and what label did instead of a verdict.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabeledItem<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ItemMeta<'a>,
    pub spec: ItemSpec<'a>,
    pub labeling: Labeling<'a>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Labeling<'a> {
    pub result: &'static str,
    pub current_value: Option<&'a str>,
    pub message: &'a str,
}

impl LabelRow {
    pub fn item(&self) -> LabeledItem<'_> {
        LabeledItem {
            api_version: API_VERSION,
            kind: "Lock",
            metadata: ItemMeta {
                namespace: &self.namespace,
                name: &self.name,
                creation_timestamp: self.created_at.as_deref(),
            },
            spec: ItemSpec {
                lock_kind: self.kind,
                labeled: self.labeled,
                holder: ItemHolder {
                    name: self.holder.as_deref(),
                    uid: self.holder_uid.as_deref(),
                },
            },
            labeling: Labeling {
                result: self.result.as_str(),
                current_value: self.current_value.as_deref(),
                message: &self.message,
            },
        }
    }
}
