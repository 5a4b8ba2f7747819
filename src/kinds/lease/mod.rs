//! A renewed Lease (client-go, controller-runtime, library-go, fabric8, the
//! Java and Python clients): `spec.holderIdentity` names a pod (its name,
//! or controller-runtime's `<hostname>_<uuid>`), renewed every few seconds.
//! Judged by that pod and the renewals the janitor observes; freed by the
//! release client-go itself writes on a clean shutdown, an update of the
//! very Lease read (its resourceVersion guards it), with no holder at all
//! where the official Java client wrote it ([`held_by_the_java_client`]).
//! Never deleted.

#[cfg(test)]
pub mod case;
use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, Client};

use super::{Answer, Judged, Kind, Object, Target, Took, Words};
use crate::lock::candidate::Shape;
use k8s_openapi::jiff::Timestamp;

use crate::lock::lease::LeaseLock;
use crate::lock::{lease, Holder, LockKind, Renewal, Unmanageable};
use crate::{call, Error};

pub struct RenewedLease;

const WORDS: Words = Words {
    doing: "Releasing this Lease",
    done: "Released this Lease",
    would: "Would release this Lease",
    untouched: "nothing written",
    freed: "released",
};

impl Kind for RenewedLease {
    fn resource(&self) -> LockKind {
        LockKind::Lease
    }

    /// Every Lease that is not held for life.
    fn claims(&self, _o: Object<'_>) -> bool {
        true
    }

    fn judged(&self) -> Judged {
        Judged::ByRenewals
    }

    /// The host its holder identity names.
    fn holder(&self, o: Object<'_>) -> Option<Holder> {
        let Object::Lease(l) = o else {
            return None;
        };
        let host = lease::parse(l).ok()?.host?;
        Some(Holder {
            name: host,
            uid: String::new(),
        })
    }

    /// Its uid and holder identity, not its resourceVersion: a holder renews
    /// every few seconds, and a renewal changes nothing the verdict depends
    /// on (a holder's death comes from the terminal-pod watch).
    fn version(&self, o: Object<'_>) -> String {
        let Object::Lease(l) = o else {
            return String::new();
        };
        let identity = l
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .unwrap_or_default();
        format!(
            "{}/{identity}",
            l.metadata.uid.as_deref().unwrap_or_default()
        )
    }

    /// Held under an identity that names a host (the janitor's own mapping
    /// of identities, `lease::host_of`). Leases no application holds (node
    /// heartbeats, API server identities, Coordinated Leader Election) and
    /// released ones are none.
    fn candidate(&self, o: Object<'_>) -> Option<Shape> {
        let Object::Lease(l) = o else {
            return None;
        };
        let host = lease::parse(l).ok()?.host?;
        Some(Shape::NamesAPod(LockKind::Lease, host))
    }

    fn words(&self) -> &'static Words {
        &WORDS
    }

    fn record(&self, o: Object<'_>) -> Option<Result<LeaseLock, Unmanageable>> {
        let Object::Lease(l) = o else {
            return None;
        };
        Some(lease::parse(l))
    }

    /// Its renew time, a MicroTime with a zone: trusted.
    fn renewal(&self, o: Object<'_>) -> Option<Renewal> {
        let Object::Lease(l) = o else {
            return None;
        };
        let spec = l.spec.as_ref();
        let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
        Some(Renewal::new(
            l.metadata.uid.as_deref().unwrap_or_default(),
            spec.and_then(|s| s.holder_identity.as_deref())
                .unwrap_or_default(),
            renewed,
            renewed,
        ))
    }

    /// Released in place: a new holder identity is a takeover; a Lease made
    /// again held for life is another kind's to look at.
    fn look(&self, o: Option<Object<'_>>, old: &Holder) -> Took {
        let Some(Object::Lease(l)) = o else {
            return Took::Waiting;
        };
        let Ok(parsed) = lease::parse(l) else {
            return Took::Done("not a lock");
        };
        // When the new holder took it; its latest renewal only when it
        // does not say: that is when the follower looked, not the takeover.
        let at = acquired(l).or(parsed.renewed);
        super::looked_in_place(parsed, old, at)
    }

    fn free<'a>(
        &'a self,
        client: &'a Client,
        t: Target<'a>,
    ) -> BoxFuture<'a, Result<Answer, Error>> {
        async move {
            // Never a copy the watch dropped annotations from: the replace
            // would erase them.
            let Some(judged) = t.lease.filter(|l| lease::is_whole(l)) else {
                return Ok(Answer::NotWritten(
                    "the Lease as judged is not at hand whole".into(),
                ));
            };
            // The judged object keeps its resourceVersion: the update fails
            // with 409 if the Lease changed since it was read.
            let mut released = lease::released(judged.clone(), t.now);
            if held_by_the_java_client(judged) {
                if let Some(spec) = released.spec.as_mut() {
                    spec.holder_identity = None;
                }
            }
            let leases: Api<Lease> = Api::namespaced(client.clone(), t.namespace());
            let action = format!("releasing lease {}/{}", t.namespace(), t.name());
            call(
                action,
                leases.replace(t.name(), &PostParams::default(), &released),
            )
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

/// The field manager the API server names the official Java client by
/// (its default user agent, up to the `/`): the HTTP client, not the
/// elector (an elector of one's own on that client matches too).
const JAVA_CLIENT: &str = "Kubernetes Java Client";

/// Whether the Lease's holder identity and its renew time were written by
/// the official Java client alone (its managedFields, as read live: the
/// watch's copy has none, and then this is false). The renew time changes
/// at every renewal, so its owner is the current holder's client (the
/// holder identity keeps its first writer while its value stays: another
/// client renewing under the same identity does not take it over). An
/// entry without its field set leaves it unknown: false; so does any other
/// manager owning anything of the spec (another client took part: after a
/// Java takeover every spec field changes hands, the transitions too). That client takes
/// a Lease at once only when it names no holder at all; after client-go's
/// `""` its follower waits its own lease from the release. Any other Lease
/// keeps `""`: fabric8 before 6.x cannot read a Lease without a holder.
pub fn held_by_the_java_client(lease: &Lease) -> bool {
    let entries = lease.metadata.managed_fields.as_deref().unwrap_or_default();
    if entries.iter().any(|e| e.fields_v1.is_none()) {
        return false;
    }
    let owns_spec = |e: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
        e.fields_v1
            .as_ref()
            .and_then(|f| f.0.pointer("/f:spec"))
            .is_some_and(|s| s.as_object().is_none_or(|o| !o.is_empty()))
    };
    if entries
        .iter()
        .filter(owns_spec)
        .any(|e| e.manager.as_deref() != Some(JAVA_CLIENT))
    {
        return false;
    }
    let only_java = |field: &str| {
        let mut owners = entries
            .iter()
            .filter(|e| {
                e.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer(field).is_some())
            })
            .peekable();
        owners.peek().is_some() && owners.all(|e| e.manager.as_deref() == Some(JAVA_CLIENT))
    };
    only_java("/f:spec/f:holderIdentity") && only_java("/f:spec/f:renewTime")
}

/// When a Lease's holder took it: every elector sets acquireTime as it
/// takes a Lease.
pub fn acquired(lease: &Lease) -> Option<Timestamp> {
    lease.spec.as_ref()?.acquire_time.as_ref().map(|t| t.0)
}
