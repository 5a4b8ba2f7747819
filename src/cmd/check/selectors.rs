//! Which Prometheus (of the Prometheus Operator) picks up a ServiceMonitor
//! or a PrometheusRule: its label selector for that kind, and its namespace
//! selector, as the operator reads them (an absent selector picks nothing;
//! an empty one picks everything; an absent namespace selector means the
//! Prometheus' own namespace). Pure, table-tested; `install::monitoring`
//! feeds it what it read.

use std::collections::BTreeMap;

use serde_json::Value;

pub type Labels = BTreeMap<String, String>;

/// The kinds a Prometheus selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Picked {
    ServiceMonitor,
    PrometheusRule,
}

impl Picked {
    /// The Prometheus spec's fields for this kind: (objects, namespaces).
    fn fields(self) -> (&'static str, &'static str) {
        match self {
            Picked::ServiceMonitor => ("serviceMonitorSelector", "serviceMonitorNamespaceSelector"),
            Picked::PrometheusRule => ("ruleSelector", "ruleNamespaceSelector"),
        }
    }

    /// The chart's value that labels objects of this kind.
    pub fn labels_value(self) -> &'static str {
        match self {
            Picked::ServiceMonitor => "serviceMonitor.additionalLabels",
            Picked::PrometheusRule => "prometheusRule.additionalLabels",
        }
    }
}

/// Whether a label selector (as the API writes it) matches `labels`.
/// Absent (null) matches nothing, as the Prometheus Operator reads it.
pub fn matches(selector: &Value, labels: &Labels) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    let by_labels = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| {
            m.iter()
                .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
        });
    let by_expressions = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_none_or(|es| es.iter().all(|e| expression_matches(e, labels)));
    by_labels && by_expressions
}

fn expression_matches(e: &Value, labels: &Labels) -> bool {
    let key = e["key"].as_str().unwrap_or_default();
    let values: Vec<&str> = e["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let value = labels.get(key).map(String::as_str);
    match e["operator"].as_str() {
        Some("In") => value.is_some_and(|v| values.contains(&v)),
        Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
        Some("Exists") => value.is_some(),
        Some("DoesNotExist") => value.is_none(),
        _ => false,
    }
}

/// Whether the Prometheus `spec` (in namespace `home`) picks an object of
/// `kind` labeled `labels` in a namespace labeled `ns_labels` named `ns`.
pub fn picks(
    spec: &Value,
    home: &str,
    kind: Picked,
    labels: &Labels,
    ns: &str,
    ns_labels: &Labels,
) -> bool {
    let (objects, namespaces) = kind.fields();
    let in_namespace = match &spec[namespaces] {
        Value::Null => ns == home,
        sel => matches(sel, ns_labels),
    };
    in_namespace && matches(&spec[objects], labels)
}

/// The labels a Prometheus asks objects of `kind` for (its matchLabels),
/// to suggest; none when it asks for none or selects by expressions only.
pub fn wanted_labels(spec: &Value, kind: Picked) -> Vec<(String, String)> {
    spec[kind.fields().0]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// How a Prometheus selects objects of `kind`, in a few words.
pub fn describe(spec: &Value, kind: Picked) -> String {
    let (objects, namespaces) = kind.fields();
    let what = match &spec[objects] {
        Value::Null => "none".to_owned(),
        v if v.as_object().is_some_and(|o| o.values().all(is_empty)) => "any".to_owned(),
        v => v.to_string(),
    };
    let whence = match &spec[namespaces] {
        Value::Null => "its own namespace".to_owned(),
        v if v.as_object().is_some_and(|o| o.values().all(is_empty)) => {
            "every namespace".to_owned()
        }
        v => format!("namespaces {v}"),
    };
    format!("{objects} {what} in {whence}")
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_read_as_the_operator_reads_them() {
        let kps = labels(&[("release", "kps"), ("app", "x")]);
        let none = labels(&[("app", "x")]);
        let table = [
            (json!(null), &kps, false),
            (json!({}), &none, true),
            (json!({"matchLabels": {}}), &none, true),
            (json!({"matchLabels": {"release": "kps"}}), &kps, true),
            (json!({"matchLabels": {"release": "kps"}}), &none, false),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "In", "values": ["kps", "b"]}]}),
                &kps,
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "NotIn", "values": ["kps"]}]}),
                &kps,
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "NotIn", "values": ["kps"]}]}),
                &none,
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "Exists"}]}),
                &none,
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "DoesNotExist"}]}),
                &none,
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "release", "operator": "Gt", "values": ["1"]}]}),
                &kps,
                false,
            ),
        ];
        for (sel, l, want) in table {
            assert_eq!(matches(&sel, l), want, "{sel} on {l:?}");
        }
    }

    #[test]
    fn a_prometheus_picks_by_its_selector_and_its_namespace_selector() {
        let unlabeled = labels(&[("app.kubernetes.io/name", "lock-janitor")]);
        let ns_labels = labels(&[("kubernetes.io/metadata.name", "janitor")]);
        // kube-prometheus-stack: objects labeled release=<its release>, in
        // every namespace.
        let kps = json!({"ruleSelector": {"matchLabels": {"release": "kps"}}, "ruleNamespaceSelector": {}});
        assert!(!picks(
            &kps,
            "monitoring",
            Picked::PrometheusRule,
            &unlabeled,
            "janitor",
            &ns_labels
        ));
        let mut labeled = unlabeled.clone();
        labeled.insert("release".into(), "kps".into());
        assert!(picks(
            &kps,
            "monitoring",
            Picked::PrometheusRule,
            &labeled,
            "janitor",
            &ns_labels
        ));
        assert_eq!(
            wanted_labels(&kps, Picked::PrometheusRule),
            [("release".to_owned(), "kps".to_owned())]
        );
        // Its ServiceMonitor selector is absent: none.
        assert!(!picks(
            &kps,
            "monitoring",
            Picked::ServiceMonitor,
            &labeled,
            "janitor",
            &ns_labels
        ));
        // OpenShift's user workload monitoring: any object, in the
        // namespaces not of the platform.
        let uwm = json!({
            "serviceMonitorSelector": {}, "ruleSelector": {},
            "serviceMonitorNamespaceSelector": {"matchExpressions": [
                {"key": "openshift.io/cluster-monitoring", "operator": "NotIn", "values": ["true"]}]},
            "ruleNamespaceSelector": {"matchExpressions": [
                {"key": "openshift.io/cluster-monitoring", "operator": "NotIn", "values": ["true"]}]},
        });
        for kind in [Picked::ServiceMonitor, Picked::PrometheusRule] {
            assert!(picks(
                &uwm,
                "openshift-user-workload-monitoring",
                kind,
                &unlabeled,
                "janitor",
                &ns_labels
            ));
            let platform = labels(&[("openshift.io/cluster-monitoring", "true")]);
            assert!(!picks(
                &uwm,
                "openshift-user-workload-monitoring",
                kind,
                &unlabeled,
                "janitor",
                &platform
            ));
        }
        // No namespace selector: its own namespace only.
        let own = json!({"serviceMonitorSelector": {}});
        assert!(picks(
            &own,
            "janitor",
            Picked::ServiceMonitor,
            &unlabeled,
            "janitor",
            &ns_labels
        ));
        assert!(!picks(
            &own,
            "monitoring",
            Picked::ServiceMonitor,
            &unlabeled,
            "janitor",
            &ns_labels
        ));
        assert_eq!(
            describe(&uwm, Picked::ServiceMonitor),
            "serviceMonitorSelector any in namespaces {\"matchExpressions\":[{\"key\":\"openshift.io/cluster-monitoring\",\"operator\":\"NotIn\",\"values\":[\"true\"]}]}"
        );
        assert_eq!(
            describe(&kps, Picked::ServiceMonitor),
            "serviceMonitorSelector none in its own namespace"
        );
    }
}
