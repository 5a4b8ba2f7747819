//! One candidate judged from a live read and, on the leader, labeled: the
//! read, the confirmation of its shape (the pods its holder names), the
//! guarded label patch and what it says (`LockOptedIn`), and a failure.

use super::*;

impl AutoOptIn {
    /// Judges `key` from a live read, and labels it if this replica leads
    /// (`pods_checked`: the identity whose host was just found to name
    /// exactly one pod). One judgement per key runs at a time; one asked
    /// for meanwhile (a change seen while it ran: a label removed right
    /// after it was written) is made once more when it ends, never lost.
    pub(super) fn judge_soon(self: Arc<Self>, key: LockKey, pods_checked: Option<String>) {
        {
            let mut s = crate::locked(&self.state);
            if let Some(again) = s.running.get_mut(&key) {
                *again = true;
                return;
            }
            s.running.insert(key.clone(), false);
        }
        tokio::spawn(async move {
            let mut pods_checked = pods_checked;
            loop {
                {
                    let _turn = self.turns.acquire().await;
                    self.judge_and_label(&key, pods_checked.take()).await;
                }
                let mut s = crate::locked(&self.state);
                if s.running.remove(&key) != Some(true) {
                    break;
                }
                s.running.insert(key.clone(), false);
            }
        });
    }

    pub(super) async fn judge_and_label(&self, key: &LockKey, mut pods_checked: Option<String>) {
        for _ in 0..ATTEMPTS {
            let read = match self.read(key, &mut pods_checked).await {
                Ok(r) => r,
                Err(e) => {
                    self.failed(key, &e, "get on configmaps and leases, list on pods");
                    // Maybe a candidate: counted (as it was, if it was) and
                    // judged again with the other retries.
                    self.maybe_unprotected(key);
                    return;
                }
            };
            let Some((meta, identity)) = read else {
                // Gone, or no candidate (now).
                self.drop_key(key);
                return;
            };
            let uid = meta.uid.clone().unwrap_or_default();
            self.unprotected(key, &uid, &identity);
            if !self.settings.write || !self.gate.may_write() {
                // Counted; the leader labels it.
                return;
            }
            let written = match key.kind {
                LockKind::ConfigMap => {
                    let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
                    write_label(&api, &meta, &self.settings.key, &self.settings.value).await
                }
                LockKind::Lease => {
                    let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
                    write_label(&api, &meta, &self.settings.key, &self.settings.value).await
                }
            };
            match written {
                Written::Labeled => {
                    self.drop_key(key);
                    self.labeled(key, &meta).await;
                    return;
                }
                Written::Gone => {
                    self.drop_key(key);
                    return;
                }
                // Changed since it was read: read and judge again.
                Written::Conflict => continue,
                Written::Failed(e) => {
                    let verb = format!("patch on {}s", key.kind.as_str());
                    self.failed(key, &e, &verb);
                    return;
                }
            }
        }
        debug!(namespace = %key.namespace, lock = %key.name, kind = %key.kind,
               "changed at each read; judged again at its next change");
    }

    /// A live read of the candidate, judged: its metadata and (Leases) its
    /// holder identity when it is a candidate without the opt-in key in
    /// reach; `None` otherwise (gone included).
    pub(super) async fn read(
        &self,
        key: &LockKey,
        pods_checked: &mut Option<String>,
    ) -> Result<Option<(ObjectMeta, String)>, Error> {
        if !self.in_reach(&key.namespace) || self.own_lease(key) {
            return Ok(None);
        }
        let what = format!("reading {} {key}", key.kind.as_str());
        match key.kind {
            LockKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
                let Some(cm) = call(what, api.get_opt(&key.name)).await? else {
                    return Ok(None);
                };
                let o = Object::ConfigMap(&cm);
                let shape = kinds::candidate(o);
                if shape.is_none()
                    && candidate::one_pod_owner(&cm.metadata)
                    && candidate::holds_data(&cm)
                {
                    // Not read again until it changes.
                    let rv = cm.metadata.resource_version.clone().unwrap_or_default();
                    crate::locked(&self.state)
                        .holds_data
                        .insert(key.clone(), rv);
                    return Ok(None);
                }
                if self.has_key(&cm.metadata) {
                    return Ok(None);
                }
                let identity = record_host(o);
                self.confirmed(key, cm.metadata, identity, shape, pods_checked)
                    .await
            }
            LockKind::Lease => {
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
                let Some(l) = call(what, api.get_opt(&key.name)).await? else {
                    return Ok(None);
                };
                if self.has_key(&l.metadata) {
                    return Ok(None);
                }
                let identity = identity_of(&l);
                let shape = kinds::candidate(Object::Lease(&l));
                self.confirmed(key, l.metadata, identity, shape, pods_checked)
                    .await
            }
        }
    }

    /// A candidate read live, confirmed: one held for life as it is; one
    /// whose holder names a host only when exactly one pod of its namespace
    /// is that host (listed once per holder identity).
    pub(super) async fn confirmed(
        &self,
        key: &LockKey,
        meta: ObjectMeta,
        identity: String,
        shape: Option<Shape>,
        pods_checked: &mut Option<String>,
    ) -> Result<Option<(ObjectMeta, String)>, Error> {
        match shape {
            None => Ok(None),
            Some(Shape::HeldForLife(_)) => Ok(Some((meta, identity))),
            Some(Shape::NamesAPod(_, host)) => {
                if pods_checked.as_deref() != Some(identity.as_str()) {
                    let hosts = BTreeSet::from([host.clone()]);
                    let counts = pods_naming(&self.client, &key.namespace, &hosts).await?;
                    if counts.get(&host) != Some(&1) {
                        return Ok(None);
                    }
                    *pods_checked = Some(identity.clone());
                }
                Ok(Some((meta, identity)))
            }
        }
    }

    /// Counted, logged and said on the lock (`LockOptedIn`).
    pub(super) async fn labeled(&self, key: &LockKey, meta: &ObjectMeta) {
        self.metrics
            .opt_ins
            .with_label_values(&[key.kind.as_str()])
            .inc();
        let label = format!("{}={}", self.settings.key, self.settings.value);
        info!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, %label,
              "lock candidate opted in");
        let say = Say {
            type_: EventType::Normal,
            reason: REASON_OPTED_IN,
            action: "OptIn",
            note: format!(
                "lock-janitor labeled this lock {label} (--auto-opt-in): it frees the lock when its \
                 holder pod can no longer run. To keep it out, label it {}=false.",
                self.settings.key
            ),
        };
        self.events
            .publish(&ref_of(key.kind, meta), None, say)
            .await;
    }

    /// A failed read or write: counted by error kind and logged with what
    /// the janitor needs. The caller keeps the candidate counted as
    /// unprotected, so that it is tried again
    /// (`retry_on_lead_and_after_failures`).
    pub(super) fn failed(&self, key: &LockKey, e: &Error, needs: &str) {
        let kind = e.kind();
        self.metrics
            .reconcile_errors
            .with_label_values(&[kind.as_str()])
            .inc();
        if kind == ErrorKind::Forbidden {
            warn!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, error = %e,
                  missing = needs,
                  "auto opt-in refused (403): the janitor's ServiceAccount lacks a permission, or an admission policy refused the label");
        } else {
            warn!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, error = %e,
                  "auto opt-in failed; trying again later");
        }
    }
}

/// For each of `hosts`, how many pods of `namespace` it names (by name or
/// hostname: `lease::names`). One paged list (100 a page, only the count
/// kept).
pub(super) async fn pods_naming(
    client: &Client,
    namespace: &str,
    hosts: &BTreeSet<String>,
) -> Result<BTreeMap<String, usize>, Error> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    crate::observe::each_pod_page(client, namespace, |page| match page {
        Paged::StartOver => counts.clear(),
        Paged::Items(pods) => {
            for p in &pods {
                for h in hosts.iter().filter(|h| lease::names(h, p)) {
                    *counts.entry(h.clone()).or_default() += 1;
                }
            }
        }
    })
    .await?;
    Ok(counts)
}
