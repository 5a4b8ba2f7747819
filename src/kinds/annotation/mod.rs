//! A ConfigMap whose leader record is the annotation
//! `control-plane.alpha.kubernetes.io/leader` (the ConfigMapLock of client-go
//! up to v0.23, fabric8, the Java and the official Python clients). The
//! record names its holder by identity, as a Lease does, and is renewed
//! every few seconds; records in the wild are loosely typed ([`record`]).
//!
//! Judged as a renewed Lease is: by the pod its holder identity names and by
//! the renewals the janitor itself observes (the record changing, on the
//! janitor's clock when its times carry no zone), never by the record's
//! clock alone. A record that does not read is unmanageable: reported,
//! never written. Freed by the release its electors understand, a merge
//! patch of that one annotation to `holderIdentity: null` and
//! `leaseDurationSeconds: 1` (the other fields kept), guarded by the
//! resourceVersion judged; never deleted. `kind="configmap"` in metrics
//! and Events.

#[cfg(test)]
pub mod case;
pub mod record;

use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{Answer, Judged, Kind, Object, Target, Took, Words};
use crate::lock::candidate::Shape;
use crate::lock::lease::{host_of, LeaseLock};
use crate::lock::{object_id, Holder, LockKind, Renewal, Unmanageable};
use crate::{call, Error};
use record::{Record, ANNOTATION};

pub struct LeaderAnnotation;

const WORDS: Words = Words {
    doing: "Releasing this lock",
    done: "Released this lock",
    would: "Would release this lock",
    untouched: "nothing written",
    freed: "released",
};

/// The annotation's value, when the object has it.
fn value<'a>(o: &Object<'a>) -> Option<&'a str> {
    o.meta()
        .annotations
        .as_ref()?
        .get(ANNOTATION)
        .map(String::as_str)
}

/// The record, when the object has one that reads.
fn read(o: &Object<'_>) -> Option<Result<Record, Unmanageable>> {
    let v = value(o)?;
    Some(record::parse(v).map_err(|e| Unmanageable::BadLeaderRecord(e.to_string())))
}

impl Kind for LeaderAnnotation {
    fn resource(&self) -> LockKind {
        LockKind::ConfigMap
    }

    /// A ConfigMap that carries the annotation, whatever its value (one
    /// that does not read is this kind's, unmanageable).
    fn claims(&self, o: Object<'_>) -> bool {
        o.resource() == LockKind::ConfigMap && value(&o).is_some()
    }

    fn judged(&self) -> Judged {
        Judged::ByRenewals
    }

    /// The host its holder identity names.
    fn holder(&self, o: Object<'_>) -> Option<Holder> {
        let host = host_of(read(&o)?.ok()?.holder.as_deref()?).ok()?;
        Some(Holder {
            name: host,
            uid: String::new(),
        })
    }

    /// Its uid and holder identity: a renewal changes neither. A record
    /// that does not read stays one version while it does not (a holder
    /// renewing it would otherwise repeat its report every few seconds).
    fn version(&self, o: Object<'_>) -> String {
        let uid = o.meta().uid.as_deref().unwrap_or_default();
        match read(&o) {
            Some(Ok(r)) => format!("{uid}/{}", r.holder.unwrap_or_default()),
            _ => format!("{uid}/?"),
        }
    }

    /// A record the janitor can judge (it reads, says for how long and
    /// when it was renewed), held under an identity that names a host.
    fn candidate(&self, o: Object<'_>) -> Option<Shape> {
        let host = self.record(o)?.ok()?.host?;
        Some(Shape::NamesAPod(LockKind::ConfigMap, host))
    }

    fn words(&self) -> &'static Words {
        &WORDS
    }

    /// A held record is judged only if its release can be written (the
    /// delete guard refuses one whose other fields name the two it
    /// replaces, or that grows past 64 KiB): else it is unmanageable, never
    /// judged stale only to be found unwritable.
    fn record(&self, o: Object<'_>) -> Option<Result<LeaseLock, Unmanageable>> {
        let r = read(&o)?;
        let releasable = |r: Record| match (&r.holder, value(&o).map(record::released)) {
            (Some(_), Some(Err(e))) => Err(Unmanageable::BadLeaderRecord(e.to_string())),
            _ => Ok(r),
        };
        Some(r.and_then(releasable).and_then(|r| leader_lock(&o, r)))
    }

    /// The renew time as written is the mark; it is trusted only with a zone.
    fn renewal(&self, o: Object<'_>) -> Option<Renewal> {
        let r = read(&o)?.ok()?;
        Some(Renewal::new(
            o.meta().uid.as_deref().unwrap_or_default(),
            r.holder.as_deref().unwrap_or_default(),
            &r.renew_mark,
            r.renewed,
        ))
    }

    fn watched_annotation(&self) -> Option<(&'static str, usize)> {
        Some((ANNOTATION, record::MAX_LEN))
    }

    /// Released in place: a record naming another holder is a takeover.
    fn look(&self, o: Option<Object<'_>>, old: &Holder) -> Took {
        let Some(o) = o else {
            return Took::Waiting;
        };
        let Some(Ok(lock)) = self.record(o) else {
            return Took::Done("not a lock");
        };
        let at = lock.renewed;
        super::looked_in_place(lock, old, at)
    }

    /// A merge patch of the annotation alone, to the released record, with
    /// the resourceVersion judged: 409 if the record was renewed or
    /// changed since.
    fn free<'a>(
        &'a self,
        client: &'a Client,
        t: Target<'a>,
    ) -> BoxFuture<'a, Result<Answer, Error>> {
        async move {
            let Some(judged) = value(&Object::ConfigMapMeta(t.meta)) else {
                return Ok(Answer::NotWritten(
                    "the record judged is not at hand".into(),
                ));
            };
            let released = match record::released(judged) {
                Ok(r) => r,
                Err(e) => return Ok(Answer::NotWritten(e.to_string())),
            };
            let patch = json!({
                "metadata": {
                    "resourceVersion": t.resource_version,
                    "annotations": { ANNOTATION: released },
                }
            });
            let pp = PatchParams {
                field_manager: Some(crate::NAME.to_owned()),
                ..Default::default()
            };
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), t.namespace());
            let action = format!("releasing lock {}/{}", t.namespace(), t.name());
            call(action, cms.patch(t.name(), &pp, &Patch::Merge(&patch)))
                .await
                .map(|_| Answer::Freed)
        }
        .boxed()
    }

    #[cfg(test)]
    fn cases(&self) -> &'static [&'static dyn crate::fixtures::Case] {
        &case::CASES
    }
}

/// The record as the generic renewed lock (`verdict::judge_lease` judges
/// it): held, it must say for how long and carry a renew time (trusted or
/// not: the janitor watches it change).
fn leader_lock(o: &Object<'_>, r: Record) -> Result<LeaseLock, Unmanageable> {
    let meta = o.meta();
    let (namespace, name, uid, resource_version) = object_id(meta)?;
    let host = r.holder.as_deref().map(host_of).transpose()?;
    if r.holder.is_some() && (r.duration.is_none() || r.renew_mark.is_none()) {
        return Err(Unmanageable::NoRenewTime);
    }
    Ok(LeaseLock {
        namespace,
        name,
        uid,
        resource_version,
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        identity: r.holder,
        host,
        renewed: r.renewed,
        duration: r.duration,
    })
}

#[cfg(test)]
mod tests;
