//! How a family is written: one gauge or counter family with its samples, and the
//! shapes of samples the families share (per GPU, per kind, only the kinds shown).

use super::labels::{GpuLabels, NoLabels, ReasonLabel, RoleLabel, StateLabel};
use crate::classify::{
    GpuAccount, GpuVerdict, InstanceVerdict, MemoryReading, OrphanReason, OwnerState, Role,
    StateTally,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::fmt;
use strum::VariantArray;

/// The GPUs that answered, with their accounts.
pub(super) type Measured<'a> = [(&'a GpuVerdict, &'a GpuAccount)];

/// The MIG instances that answered, with their GPU's verdict and their accounts.
pub(super) type MeasuredInstances<'a> = [(&'a GpuVerdict, &'a InstanceVerdict, &'a GpuAccount)];

/// Name, help and reading of one memory gauge.
pub(super) type MemorySeries = (&'static str, &'static str, fn(&MemoryReading) -> u64);

/// Writes one family of `kind` with all its samples, each value made a metric by `metric`;
/// a family without a sample is not written at all. Its HELP and TYPE alone would say
/// nothing a reader can use, and on an idle host they were a third of the families (27
/// of 68 on eight idle GPUs): the MIG families without MIG, the culprit and owner
/// families without owners, the error families while nothing fails.
pub(super) fn family<L, V, M, I>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    kind: MetricType,
    metric: fn(V) -> M,
    samples: I,
) -> fmt::Result
where
    L: EncodeLabelSet,
    M: EncodeMetric,
    I: IntoIterator<Item = (L, V)>,
{
    let mut samples = samples.into_iter().peekable();
    if samples.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        metric(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one gauge family with all its samples.
pub(super) fn gauge<L, V, I>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: I,
) -> fmt::Result
where
    L: EncodeLabelSet,
    V: prometheus_client::encoding::EncodeGaugeValue + Clone + Default,
    I: IntoIterator<Item = (L, V)>,
{
    let metric = ConstGauge::new;
    family(encoder, (name, help), MetricType::Gauge, metric, samples)
}

/// Writes one counter family; prometheus-client appends `_total` to `name`.
pub(super) fn counter<L, I>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: I,
) -> fmt::Result
where
    L: EncodeLabelSet,
    I: IntoIterator<Item = (L, u64)>,
{
    let metric = ConstCounter::new;
    family(encoder, (name, help), MetricType::Counter, metric, samples)
}

/// One sample without labels.
pub(super) fn single<V>(value: V) -> [(NoLabels, V); 1] {
    [(NoLabels {}, value)]
}

pub(super) fn flag(value: bool) -> i64 {
    i64::from(value)
}

/// One sample per GPU where `value` has one.
pub(super) fn per_gpu<'a, V>(
    gpus: &'a [GpuVerdict],
    value: impl Fn(&'a GpuVerdict) -> Option<V> + 'a,
) -> impl Iterator<Item = (GpuLabels, V)> + 'a {
    gpus.iter()
        .filter_map(move |gpu| Some((GpuLabels::of(gpu), value(gpu)?)))
}

/// One sample per GPU for the kind it shows (`is` answers true), always 1; a GPU that
/// shows none of the kinds has none. The other kinds' zeros are left out: on a fleet they
/// were most of the series and said nothing (docs/fleet.md, "Cardinality").
pub(super) fn active_kind<'a, K: 'a, L: 'a>(
    gpus: &'a [GpuVerdict],
    kinds: impl IntoIterator<Item = K> + Clone + 'a,
    label: impl Fn(&K) -> L + Copy + 'a,
    is: impl Fn(&'a GpuVerdict, &K) -> Option<bool> + Copy + 'a,
) -> impl Iterator<Item = ((GpuLabels, L), i64)> + 'a {
    gpus.iter().flat_map(move |gpu| {
        kinds.clone().into_iter().filter_map(move |kind| {
            is(gpu, &kind)?.then(|| ((GpuLabels::of(gpu), label(&kind)), 1))
        })
    })
}

/// A figure of the owners in one state: their count or their bytes.
pub(super) type TallyOf = fn(&StateTally, OwnerState) -> u64;

/// Per account, one sample per kind (an owner state, a reason, a role): the account's
/// labels with the kind's, and the account's figure for the kind.
pub(super) fn by_kind<'a, A: Clone + 'a, K: Copy + 'static, L: 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
    kinds: &'static [K],
    label: fn(K) -> L,
    figure: impl Fn(&GpuAccount, K) -> u64 + Copy + 'a,
) -> impl Iterator<Item = ((A, L), u64)> + 'a {
    accounts.flat_map(move |(labels, account)| {
        kinds
            .iter()
            .map(move |&kind| ((labels.clone(), label(kind)), figure(account, kind)))
    })
}

/// [`by_kind`] without the kinds whose figure is 0: counts of processes by state, reason
/// or role, where an idle GPU had a zero for every kind and a fleet paid a series for each
/// (docs/fleet.md, "Cardinality"). A missing kind reads as none.
pub(super) fn nonzero_by_kind<'a, A: Clone + 'a, K: Copy + 'static, L: 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
    kinds: &'static [K],
    label: fn(K) -> L,
    figure: impl Fn(&GpuAccount, K) -> u64 + Copy + 'a,
) -> impl Iterator<Item = ((A, L), u64)> + 'a {
    by_kind(accounts, kinds, label, figure).filter(|(_, value)| *value != 0)
}

/// Orphaned bytes by reason, per account.
pub(super) fn orphaned_by_reason<'a, A: Clone + 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
) -> impl Iterator<Item = ((A, ReasonLabel), u64)> + 'a {
    let label = |reason: OrphanReason| ReasonLabel {
        reason: reason.as_str(),
    };
    by_kind(
        accounts,
        OrphanReason::VARIANTS,
        label,
        GpuAccount::orphaned_by,
    )
}

/// Holders by role, per account.
pub(super) fn holders_by_role<'a, A: Clone + 'a>(
    accounts: impl Iterator<Item = (A, &'a GpuAccount)> + 'a,
) -> impl Iterator<Item = ((A, RoleLabel), u64)> + 'a {
    let count = |account: &GpuAccount, role| account.holders(role).len() as u64;
    nonzero_by_kind(
        accounts,
        Role::VARIANTS,
        |role| RoleLabel {
            role: role.as_str(),
        },
        count,
    )
}

pub(super) fn state_label(state: OwnerState) -> StateLabel {
    let state = state.as_str();
    StateLabel { state }
}
