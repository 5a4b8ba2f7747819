//! Which watched ConfigMap locks hold no data, by version, learned without
//! reading any lock whole. The lock watch is metadata-only (memory at
//! 10,000 locks), so a lock settled at start-up from its metadata alone is
//! not known to be empty, and its reclaim would read it once more before
//! the DELETE. The API server's table of ConfigMaps (what `kubectl get
//! configmaps` prints) has a `Data` column, the number of `data` and
//! `binaryData` keys, computed from the same object as the row's metadata:
//! one paged list of rows says, for each lock and resourceVersion, whether
//! it holds data, with no data sent.
//!
//! What is learned is only ever an exemption from one read: a version
//! marked here is the version the guarded DELETE names (its uid and
//! resourceVersion preconditions refuse any other), and anything this
//! cannot tell (no table, no `Data` column, a cell that is not a count, a
//! row without metadata) marks nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use serde::Deserialize;

use crate::Error;

/// Rows per page: metadata only, as small as a metadata list's.
const PAGE: u32 = 500;

/// One row's answer: the lock's metadata as listed and its count of
/// `data` + `binaryData` keys.
pub struct Row {
    pub meta: ObjectMeta,
    pub data_keys: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Table {
    kind: String,
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    column_definitions: Vec<Column>,
    #[serde(default)]
    rows: Vec<TableRow>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct Column {
    name: String,
}

#[derive(Deserialize)]
struct TableRow {
    #[serde(default)]
    cells: Vec<serde_json::Value>,
    object: Option<RowObject>,
}

#[derive(Deserialize)]
struct RowObject {
    metadata: Option<ObjectMeta>,
}

/// What one learning did.
#[derive(Debug, Clone, Copy)]
pub struct Learned {
    pub requests: u32,
    /// False when the API server answered the same continue token twice:
    /// the list stopped there.
    pub whole: bool,
}

/// The path of the ConfigMaps of a scope.
fn path(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/configmaps"),
        None => "/api/v1/configmaps".to_owned(),
    }
}

/// The rows of one page, each with what it can tell; a page that is not a
/// ConfigMap table with a `Data` column tells nothing.
fn rows_of(table: Table) -> (Vec<Row>, Option<String>) {
    let next = table.metadata.continue_.filter(|c| !c.is_empty());
    if table.kind != "Table" {
        return (Vec::new(), None);
    }
    let Some(col) = table
        .column_definitions
        .iter()
        .position(|c| c.name == "Data")
    else {
        return (Vec::new(), None);
    };
    let rows = table
        .rows
        .into_iter()
        .filter_map(|r| {
            let data_keys = r.cells.get(col)?.as_u64()?;
            let meta = r.object?.metadata?;
            Some(Row { meta, data_keys })
        })
        .collect();
    (rows, next)
}

/// Lists the opted-in ConfigMaps of a scope as table rows, page by page,
/// handing each row to `each`. Says how many requests it made and whether
/// it listed every page. The caller bounds how long it may take (a page
/// answers within the client's timeout; a continue token repeated ends the
/// list).
pub async fn learn(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    mut each: impl FnMut(Row),
) -> Result<Learned, Error> {
    let mut cont: Option<String> = None;
    let mut requests = 0;
    let action = "listing watched ConfigMaps as a table";
    loop {
        let lp = kube::api::ListParams {
            label_selector: Some(selector.to_owned()),
            limit: Some(PAGE),
            continue_token: cont.clone(),
            ..Default::default()
        };
        let built = kube::core::Request::new(path(namespace))
            .list(&lp)
            .map_err(kube::Error::BuildRequest)
            .and_then(|mut req| {
                // kube builds the list; the table and its metadata rows are
                // asked for as kubectl asks.
                let uri = format!("{}&includeObject=Metadata", req.uri());
                *req.uri_mut() = uri.parse().map_err(|e: http::uri::InvalidUri| {
                    kube::Error::BuildRequest(kube::core::request::Error::Validation(e.to_string()))
                })?;
                req.headers_mut().insert(
                    http::header::ACCEPT,
                    http::HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io"),
                );
                Ok(req)
            });
        let req = built.map_err(|source| Error::Kube {
            action: action.into(),
            source,
        })?;
        requests += 1;
        let table: Table = crate::call(action, client.request::<Table>(req)).await?;
        let (rows, next) = rows_of(table);
        rows.into_iter().for_each(&mut each);
        // The token just sent, answered again, would list the same page
        // for ever: the rows of the pages before stand, the rest are not
        // known.
        let whole = match next {
            None => true,
            Some(c) if cont.as_deref() == Some(c.as_str()) => false,
            Some(c) => {
                cont = Some(c);
                continue;
            }
        };
        return Ok(Learned { requests, whole });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(json: serde_json::Value) -> Table {
        serde_json::from_value(json).expect("a table")
    }

    /// The API server's answer, as `kubectl get configmaps` asks for it.
    #[test]
    fn rows_carry_the_data_count_and_metadata() {
        let t = table(serde_json::json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "9", "continue": "abc"},
            "columnDefinitions": [{"name": "Name"}, {"name": "Data"}, {"name": "Age"}],
            "rows": [
                {"cells": ["a", 0, "5m"], "object": {"kind": "PartialObjectMetadata",
                    "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7", "uid": "u"}}},
                {"cells": ["b", 2, "5m"], "object": {"metadata": {"name": "b", "resourceVersion": "8"}}},
            ]
        }));
        let (rows, next) = rows_of(t);
        assert_eq!(next.as_deref(), Some("abc"));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].data_keys, 0);
        assert_eq!(rows[0].meta.resource_version.as_deref(), Some("7"));
        assert_eq!(rows[1].data_keys, 2);
    }

    /// Whatever is not a count in a `Data` column tells nothing.
    #[test]
    fn anything_else_tells_nothing() {
        let no_column = table(serde_json::json!({
            "kind": "Table", "columnDefinitions": [{"name": "Name"}],
            "rows": [{"cells": ["a"], "object": {"metadata": {"name": "a"}}}]
        }));
        assert!(rows_of(no_column).0.is_empty());
        let not_a_table = table(serde_json::json!({"kind": "ConfigMapList"}));
        assert!(rows_of(not_a_table).0.is_empty());
        let odd_cells = table(serde_json::json!({
            "kind": "Table", "columnDefinitions": [{"name": "Name"}, {"name": "Data"}],
            "rows": [
                {"cells": ["a", "0"], "object": {"metadata": {"name": "a"}}},
                {"cells": ["b", -1], "object": {"metadata": {"name": "b"}}},
                {"cells": ["c"], "object": {"metadata": {"name": "c"}}},
                {"cells": ["d", 0]},
                {"cells": ["e", 0], "object": {}},
            ]
        }));
        assert!(rows_of(odd_cells).0.is_empty());
    }
}
