//! A ConfigMap held for life (operator-lib's `leader.Become`): one v1 Pod
//! ownerReference names the leader; no data. Judged by that owner, freed by
//! a DELETE with uid and resourceVersion preconditions (the garbage
//! collector's own job, when the owner pod object stays in the API).

#[cfg(test)]
pub mod case;
use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;

use super::{Answer, Judged, Kind, Object, Taken, Target, Took, Words};
use crate::lock::candidate::{one_pod_owner, Shape};
use crate::lock::{self, Holder, LockKind};
use crate::Error;

pub struct ConfigMapHeldForLife;

const WORDS: Words = Words {
    doing: "Deleting this lock",
    done: "Deleted this lock",
    would: "Would delete this lock",
    untouched: "nothing deleted",
    freed: "deleted",
};

impl Kind for ConfigMapHeldForLife {
    fn resource(&self) -> LockKind {
        LockKind::ConfigMap
    }

    /// Every ConfigMap no other kind claims: one that is not lock-shaped is
    /// judged unmanageable, and reported.
    fn claims(&self, _o: Object<'_>) -> bool {
        true
    }

    fn judged(&self) -> Judged {
        Judged::ByOwner
    }

    fn holder(&self, o: Object<'_>) -> Option<Holder> {
        super::owner(o)
    }

    /// Its resourceVersion: anything that changes it (an owner, a label)
    /// may change the judgement.
    fn version(&self, o: Object<'_>) -> String {
        o.meta().resource_version.clone().unwrap_or_default()
    }

    /// One v1 Pod owner, and, read whole, no data (operator-lib's locks
    /// are empty; Spark drivers, for one, own ConfigMaps with data). A
    /// metadata-only read cannot tell data: its caller reads it whole
    /// before it writes.
    fn candidate(&self, o: Object<'_>) -> Option<Shape> {
        (one_pod_owner(o.meta()) && o.holds_data() != Some(true))
            .then_some(Shape::HeldForLife(LockKind::ConfigMap))
    }

    fn words(&self) -> &'static Words {
        &WORDS
    }

    /// Made again by a new holder (the old one was deleted): its owner.
    fn look(&self, o: Option<Object<'_>>, old: &Holder) -> Took {
        let Some(o) = o else {
            return Took::Waiting;
        };
        match lock::parse(o.meta()) {
            // Same holder: the lock was not deleted but left the selector
            // (someone removed the label). Nothing is awaited.
            Ok(l) if l.holder.uid == old.uid => Took::Done("opted out"),
            Ok(_) if o.holds_data() == Some(true) => Took::Done("re-created with data: not a lock"),
            Ok(l) => Took::Taken(Box::new(Taken {
                // When the new lock was created, not when this follower looked.
                at: o.meta().creation_timestamp.as_ref().map(|t| t.0),
                holder: l,
                carry: true,
            })),
            Err(why) => {
                tracing::info!(namespace = ?o.meta().namespace, lock = ?o.meta().name, why = %why,
                      "the lock was re-created but is not a leader-for-life lock; not following it");
                Took::Done("not a lock")
            }
        }
    }

    fn free<'a>(
        &'a self,
        client: &'a Client,
        t: Target<'a>,
    ) -> BoxFuture<'a, Result<Answer, Error>> {
        super::delete::<ConfigMap>(client, t, "lock").boxed()
    }

    #[cfg(test)]
    fn cases(&self) -> &'static [&'static dyn crate::fixtures::Case] {
        &case::CASES
    }
}
