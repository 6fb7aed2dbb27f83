//! Series read at scrape time (`/metrics`): a registry of the scrape's
//! own, and the shapes shepherd registers in it (gauges, counters kept
//! elsewhere, histograms a runner kept), with their labels.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::control::{DURATION_BUCKETS, Durations};

pub type Labels = Vec<(&'static str, String)>;

/// Series read at scrape time, registered into a registry of the scrape's.
pub struct Scrape(pub(super) Registry);

/// A histogram some runner kept ([`Durations`]), as of the scrape.
#[derive(Debug, Default)]
struct KeptHistogram(std::sync::Mutex<Durations>);

impl TypedMetric for KeptHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for KeptHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let d = self.0.lock().map_err(|_| std::fmt::Error)?;
        let buckets: Vec<(f64, u64)> = DURATION_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(d.buckets)
            .collect();
        encoder.encode_histogram::<NoLabelSet>(d.sum, d.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl Scrape {
    pub(super) fn gauge(&mut self, name: &str, help: &str, value: i64) {
        let g: Gauge = Gauge::default();
        g.set(value);
        self.0.register(name, help, g);
    }

    pub(super) fn counter(&mut self, name: &str, help: &str, value: u64) {
        let c: Counter = Counter::default();
        c.inc_by(value);
        self.0.register(name, help, c);
    }

    pub(super) fn histograms(
        &mut self,
        name: &str,
        help: &str,
        unit: Unit,
        values: impl IntoIterator<Item = (Labels, Durations)>,
    ) {
        let f: Family<Labels, KeptHistogram> = Family::default();
        for (l, v) in values {
            *f.get_or_create(&l).0.lock().unwrap() = v;
        }
        self.0.register_with_unit(name, help, unit, f);
    }

    pub(super) fn gauges(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, i64)>,
    ) {
        let f: Family<Labels, Gauge> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).set(v);
        }
        self.0.register(name, help, f);
    }

    /// Counters kept elsewhere (a mailbox's tallies), as of now. `name`
    /// without `_total`.
    pub(super) fn counters(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let f: Family<Labels, Counter> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).inc_by(v);
        }
        self.0.register(name, help, f);
    }

    /// Seconds counted elsewhere, as of now. `name` without `_seconds_total`.
    pub(super) fn seconds_counters(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let f: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>> = Family::default();
        for (l, v) in values {
            f.get_or_create(&l).inc_by(v);
        }
        self.0.register_with_unit(name, help, Unit::Seconds, f);
    }
}

pub fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}
