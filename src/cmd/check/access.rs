//! What the janitor's ServiceAccount may do: the RBAC its configured scope
//! needs (SubjectAccessReview for the ServiceAccount, not the caller), and
//! the delete guard that narrows it (a dry-run DELETE it must deny).

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use super::install::{policy_and_binding, served};
use super::{Check, Install};
use crate::call;
use crate::lock::LockKind;

/// How often an allowed dry-run DELETE is tried again (a second apart).
const GUARD_RETRIES: usize = 3;

/// One permission: (API group, resource, verb, namespace (None: all), name).
type Need = (
    &'static str,
    &'static str,
    &'static str,
    Option<String>,
    Option<String>,
);

/// What `run` with these flags does with the API (the chart's rules).
pub fn needs(i: &Install) -> Vec<Need> {
    let r = &i.run;
    let namespaces = crate::scopes(&r.scope.namespaces);
    let mut rules: Vec<(&str, &str, &[&str])> = Vec::new();
    if r.lock_kinds.contains(&LockKind::ConfigMap) {
        rules.push((
            "",
            "configmaps",
            &["get", "list", "watch", "delete", "patch"],
        ));
    }
    if r.lock_kinds.contains(&LockKind::Lease) {
        rules.push((
            "coordination.k8s.io",
            "leases",
            &["get", "list", "watch", "update", "delete", "patch"],
        ));
    }
    rules.push((
        "",
        "pods",
        if r.delete_pod {
            &["get", "list", "watch", "delete"]
        } else {
            &["get", "list", "watch"]
        },
    ));
    rules.push(("events.k8s.io", "events", &["create", "patch", "list"]));
    let mut out = Vec::new();
    for ns in &namespaces {
        for (group, resource, verbs) in &rules {
            for verb in *verbs {
                out.push((*group, *resource, *verb, ns.clone(), None));
            }
        }
    }
    if r.leader_elect {
        let ns = r
            .leader_elect_namespace
            .clone()
            .unwrap_or_else(|| i.namespace.clone());
        let lease = Some(r.leader_elect_lease.clone());
        for verb in ["get", "update"] {
            out.push((
                "coordination.k8s.io",
                "leases",
                verb,
                Some(ns.clone()),
                lease.clone(),
            ));
        }
        out.push(("coordination.k8s.io", "leases", "create", Some(ns), None));
    }
    out
}

fn need_text((group, resource, verb, ns, name): &Need) -> String {
    let res = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let res = match name {
        Some(n) => format!("{res}/{n}"),
        None => res,
    };
    match ns {
        Some(ns) => format!("{verb} {res} in {ns}"),
        None => format!("{verb} {res} (all namespaces)"),
    }
}

async fn allowed(client: &Client, i: &Install, need: &Need) -> anyhow::Result<bool> {
    let (group, resource, verb, ns, name) = need;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(i.user()),
            groups: Some(i.groups()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                verb: Some(verb.to_string()),
                namespace: ns.clone(),
                name: name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let r = call(
        format!("reviewing {}", need_text(need)),
        api.create(&PostParams::default(), &review),
    )
    .await?;
    Ok(r.status.is_some_and(|s| s.allowed))
}

/// Check 3: the ServiceAccount may do what the configured scope needs.
pub async fn rbac(i: &Install) -> Check {
    const NAME: &str = "rbac";
    let needs = needs(i);
    let results: Vec<anyhow::Result<bool>> = futures::stream::iter(&needs)
        .map(|n| allowed(&i.client, i, n))
        .buffered(8)
        .collect()
        .await;
    let mut missing = Vec::new();
    let mut denied = Vec::new();
    for (n, r) in needs.iter().zip(results) {
        match r {
            Ok(true) => {}
            Ok(false) => {
                missing.push(need_text(n));
                denied.push(n.clone());
            }
            Err(e) => return Check::or_failed(NAME, Err(e), "create on subjectaccessreviews"),
        }
    }
    if missing.is_empty() {
        return Check::ok(
            NAME,
            format!(
                "{} may do the {} things its scope ({}) needs",
                i.user(),
                needs.len(),
                i.scope_text()
            ),
        );
    }
    let role = if i.run.scope.namespaces.is_empty() {
        // The chart names it after the install and its namespace, so that
        // two installs of one release name do not share it.
        format!("ClusterRole {}-{}", i.name, i.namespace)
    } else {
        format!("Role {} in each watched namespace", i.name)
    };
    let mut refused = Vec::new();
    for ns in refused_scopes(&denied) {
        let gone = matches!(
            Api::<k8s_openapi::api::core::v1::Namespace>::all(i.client.clone())
                .get_opt(&ns)
                .await,
            Ok(None)
        );
        refused.push(if gone {
            format!("{ns} (no such namespace)")
        } else {
            ns
        });
    }
    let every = !refused.is_empty() && refused.len() == i.run.scope.namespaces.len();
    let refused = if refused.is_empty() {
        String::new()
    } else if every {
        format!(
            "; every watched scope refused, so the janitor does not start (exit 1): {}",
            refused.join(", ")
        )
    } else {
        format!(
            "; scopes refused (not watched, their locks not reclaimed; the janitor serves the others and checks these again, 5 s at first, then up to every 2 minutes): {}",
            refused.join(", ")
        )
    };
    Check::fail(
        NAME,
        format!("{} may not: {}{refused}", i.user(), missing.join(", ")),
        format!(
            "the chart's {role} grants these (a namespace must exist before its Role can); restore them: {}",
            i.helm_upgrade("")
        ),
    )
}

/// The watched namespaces where a list or watch the janitor's start-up
/// check makes is denied: `run` leaves them out and retries them.
fn refused_scopes(denied: &[Need]) -> Vec<String> {
    let mut v: Vec<String> = denied
        .iter()
        .filter(|(_, resource, verb, _, name)| {
            name.is_none()
                && matches!(*verb, "list" | "watch")
                && matches!(*resource, "configmaps" | "leases" | "pods")
        })
        .filter_map(|(_, _, _, ns, _)| ns.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A ConfigMap in the janitor's scope that is not opted in: the DELETE the
/// guard must deny.
async fn target(i: &Install) -> anyhow::Result<Option<(String, String)>> {
    let Some((key, value)) = i.run.scope.selector.opt_in_label() else {
        return Ok(None);
    };
    let lp = ListParams::default()
        .labels(&format!("{key}!={value}"))
        .limit(20);
    let namespaces: Vec<Option<&str>> = if i.run.scope.namespaces.is_empty() {
        vec![Some(i.namespace.as_str()), None]
    } else {
        i.run
            .scope
            .namespaces
            .iter()
            .map(|n| Some(n.as_str()))
            .collect()
    };
    for ns in namespaces {
        let api: Api<ConfigMap> = crate::scoped(&i.client, ns);
        let list = call("listing configmaps", api.list_metadata(&lp)).await?;
        if let Some(cm) = list.items.into_iter().next() {
            return Ok(Some((
                cm.metadata.namespace.unwrap_or_default(),
                cm.metadata.name.unwrap_or_default(),
            )));
        }
    }
    Ok(None)
}

/// Check 4: the delete guard exists where served and denies what it must.
pub async fn delete_guard(i: &Install) -> Check {
    Check::or_failed(
        GUARD,
        guard(i).await,
        "get on validatingadmissionpolicies and their bindings",
    )
}

/// The name of check 4.
const GUARD: &str = "delete-guard";

/// Check 4's steps: the policy API served, the policy and a binding that
/// denies, then a dry-run DELETE as the janitor that it must deny.
async fn guard(i: &Install) -> anyhow::Result<Check> {
    const NAME: &str = GUARD;
    let gv = "admissionregistration.k8s.io/v1";
    if !served(&i.client, gv, "validatingadmissionpolicies").await? {
        return Ok(Check::warn(
            NAME,
            format!(
                "this API server serves no ValidatingAdmissionPolicy v1 (Kubernetes before 1.30): \
                 RBAC alone lets {} delete every ConfigMap in {}",
                i.user(),
                i.scope_text()
            ),
            "upgrade the cluster to Kubernetes 1.30 or later; the chart then installs the guard",
        ));
    }
    let name = format!("{}-{}-guard", i.name, i.namespace);
    let unguarded = format!(
        "RBAC alone lets {} delete every ConfigMap in {}",
        i.user(),
        i.scope_text()
    );
    let restore = i.helm_upgrade("--set admissionPolicies.deleteGuard.enabled=true");
    let Some((_, binding)) = policy_and_binding(i, gv, "ValidatingAdmissionPolicy", &name).await?
    else {
        return Ok(Check::fail(
            NAME,
            format!("no ValidatingAdmissionPolicy {name}: {unguarded}"),
            restore,
        ));
    };
    let denies = binding.as_ref().is_some_and(|b| {
        b.data["spec"]["policyName"] == name.as_str()
            && b.data["spec"]["validationActions"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "Deny"))
    });
    if !denies {
        return Ok(Check::fail(
            NAME,
            format!(
                "ValidatingAdmissionPolicy {name} has no binding {name} that denies: {unguarded}"
            ),
            restore,
        ));
    }
    let Some((ns, cm)) = target(i).await? else {
        return Ok(Check::warn(
            NAME,
            format!("ValidatingAdmissionPolicy {name} and its binding exist; not tried: no ConfigMap outside the opt-in in {}", i.scope_text()),
            "create any ConfigMap there and run check again",
        ));
    };
    let tried = format!(
        "a dry-run DELETE of ConfigMap {ns}/{cm} (not opted in) as {}",
        i.user()
    );
    let result = dry_run_delete_as_janitor(i, &ns, &cm).await?;
    Ok(guard_verdict(i, result, &name, &tried, &restore))
}

/// A dry-run DELETE of ConfigMap `ns/cm` impersonating the janitor. The API
/// server applies a new or changed policy within a moment (its policy
/// informer): an allowed DELETE is tried again, a few times, before it
/// counts.
async fn dry_run_delete_as_janitor(
    i: &Install,
    ns: &str,
    cm: &str,
) -> anyhow::Result<Result<(), crate::Error>> {
    let mut config = i.config.clone();
    config.auth_info.impersonate = Some(i.user());
    config.auth_info.impersonate_groups = Some(i.groups());
    let as_janitor = Client::try_from(config)?;
    let api: Api<ConfigMap> = Api::namespaced(as_janitor, ns);
    let dp = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    let mut result = call("dry-run delete", api.delete(cm, &dp)).await;
    for _ in 0..GUARD_RETRIES {
        if result.is_err() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        result = call("dry-run delete", api.delete(cm, &dp)).await;
    }
    Ok(result.map(|_| ()))
}

/// What the dry-run DELETE's answer says of the guard.
fn guard_verdict(
    i: &Install,
    result: Result<(), crate::Error>,
    name: &str,
    tried: &str,
    restore: &str,
) -> Check {
    const NAME: &str = GUARD;
    match result {
        Ok(()) => Check::fail(
            NAME,
            format!("{tried} was allowed: ValidatingAdmissionPolicy {name} does not stop it"),
            format!("compare the policy with the chart's (kubectl get validatingadmissionpolicy {name} -o yaml); {restore}"),
        ),
        Err(crate::Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 403 => if s.message.contains(name) {
            Check::ok(NAME, format!("ValidatingAdmissionPolicy {name} denies {tried}"))
        } else if s.message.contains("impersonate") {
            Check::warn(
                NAME,
                format!("ValidatingAdmissionPolicy {name} and its binding exist; not tried: you may not impersonate {} ({})", i.user(), s.message),
                "run check as a user who may impersonate serviceaccounts, users and groups (cluster-admin may) to see the guard deny",
            )
        } else {
            Check::warn(
                NAME,
                format!("ValidatingAdmissionPolicy {name} and its binding exist; not tried: RBAC denied {tried} first ({})", s.message),
                "see the rbac check",
            )
        },
        Err(e) => Check::warn(
            NAME,
            format!("ValidatingAdmissionPolicy {name} and its binding exist; {tried} failed: {e}"),
            "run check again; if it persists, look at the API server",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_without_list_or_watch_is_refused() {
        let need =
            |resource, verb, ns: &str| -> Need { ("", resource, verb, Some(ns.to_owned()), None) };
        let denied = vec![
            need("configmaps", "list", "b"),
            need("pods", "watch", "b"),
            need("configmaps", "delete", "c"),
            need("events", "list", "d"),
            (
                "coordination.k8s.io",
                "leases",
                "get",
                Some("ops".into()),
                Some("lock-janitor".into()),
            ),
            need("leases", "watch", "a"),
        ];
        assert_eq!(refused_scopes(&denied), ["a", "b"]);
    }
}
