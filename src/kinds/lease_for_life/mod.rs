//! A Lease held for life (nais/elector): one v1 Pod ownerReference, neither
//! `renewTime` nor `leaseDurationSeconds`, held by nobody or by that owner.
//! Its holder never renews it and its candidates only create it (one that
//! finds it there has lost), so a release frees nothing: it is judged as a
//! ConfigMap held for life is, by its owner, and freed by a DELETE with uid
//! and resourceVersion preconditions.

#[cfg(test)]
pub mod case;
use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;

use super::{Answer, Judged, Kind, Object, Taken, Target, Took, Words};
use crate::lock::candidate::Shape;
use crate::lock::{lease, Holder, LockKind};
use crate::Error;

pub struct LeaseHeldForLife;

const WORDS: Words = Words {
    doing: "Deleting this Lease",
    done: "Deleted this Lease",
    would: "Would delete this Lease",
    untouched: "nothing deleted",
    freed: "deleted",
};

impl Kind for LeaseHeldForLife {
    fn resource(&self) -> LockKind {
        LockKind::Lease
    }

    fn claims(&self, o: Object<'_>) -> bool {
        matches!(o, Object::Lease(l) if lease::held_for_life(l))
    }

    fn judged(&self) -> Judged {
        Judged::ByOwner
    }

    fn holder(&self, o: Object<'_>) -> Option<Holder> {
        super::owner(o)
    }

    /// Its uid and resourceVersion: never renewed, it changes only when
    /// something a judgement depends on does (an owner, a label).
    fn version(&self, o: Object<'_>) -> String {
        let m = o.meta();
        format!(
            "{}/{}",
            m.uid.as_deref().unwrap_or_default(),
            m.resource_version.as_deref().unwrap_or_default()
        )
    }

    fn candidate(&self, o: Object<'_>) -> Option<Shape> {
        self.claims(o)
            .then_some(Shape::HeldForLife(LockKind::Lease))
    }

    fn words(&self) -> &'static Words {
        &WORDS
    }

    /// Made again by a candidate (a Lease held for life is deleted, not
    /// released): its owner is the new holder.
    fn look(&self, o: Option<Object<'_>>, old: &Holder) -> Took {
        let Some(Object::Lease(l)) = o else {
            return Took::Waiting;
        };
        match crate::lock::parse(&l.metadata) {
            Ok(p) if p.holder.uid == old.uid => Took::Done("held again by the same pod"),
            Ok(p) => Took::Taken(Box::new(Taken {
                at: super::lease::acquired(l).or(l
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)),
                holder: p,
                carry: true,
            })),
            Err(_) => Took::Done("not a lock"),
        }
    }

    fn free<'a>(
        &'a self,
        client: &'a Client,
        t: Target<'a>,
    ) -> BoxFuture<'a, Result<Answer, Error>> {
        super::delete::<Lease>(client, t, "lease").boxed()
    }

    #[cfg(test)]
    fn cases(&self) -> &'static [&'static dyn crate::fixtures::Case] {
        &case::CASES
    }
}
