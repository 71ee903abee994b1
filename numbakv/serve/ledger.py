"""What the `Engine` keeps of its requests and reads off them: `Requests`, every request by
id, and `next_input`, the input a running sample's next piece of work feeds."""

from numbakv.core.errors import ConfigError
from numbakv.core.values import as_int
from numbakv.serve.batch import Input
from numbakv.serve.requests import EngineMetrics, Request, Sample
from numbakv.serve.scheduler import Work


class Requests(dict[int, Request]):
    """The engine's requests by id, from 0 in submission order: owns them, finished ones
    included (their results stay). A dict, so that callbacks and tests look ids up as keys;
    the engine holds its lock around every use."""

    def add(self, fields: dict, submitted_at: float) -> Request:
        """A new request of `fields` (`check_submission`'s), the next id."""
        request = Request(len(self), **fields, submitted_at=submitted_at)
        self[request.id] = request
        return request

    def find(self, request: int) -> Request:
        """The request of id `request`; ConfigError for what is no submitted id."""
        request = as_int("request", request, ConfigError, "; submit() returns request ids")
        if request not in self:
            raise ConfigError(
                f"no request {request}: {len(self)} were submitted, with ids from 0; "
                "submit() returns request ids"
            )
        return self[request]

    def metrics(self, n_steps: int, executor, sessions, prefix_cache) -> EngineMetrics:
        """The engine's `EngineMetrics`: its steps, `executor`'s forward counts, every
        request's counts summed, and what the prefix cache (`sessions`') evicted and holds
        and its host tier holds, kept and reloaded."""
        rs = self.values()
        sums = (
            sum(len(r.prompt) for r in rs), sum(r.n_cached_tokens for r in rs),
            sum(r.n_recomputed_tokens for r in rs), sum(r.n_preemptions for r in rs),
        )  # fmt: skip
        forwards = getattr(executor, "forward_counts", None)
        cells = (sessions.n_evicted_cells, sessions.cached_cells)
        n_host = sum(r.n_host_cached_tokens for r in rs)
        host = None if prefix_cache is None else prefix_cache.host
        tier = (0, 0, 0) if host is None else (host.nbytes, host.n_offloaded_tokens, host.n_reloads)
        return EngineMetrics(n_steps, forwards, *sums, *cells, n_host, *tier)


def next_input(r: Request, sample: Sample, work: Work) -> Input:
    """The tokens of `work` from `sample`'s next position, which moves past them; the input
    that ends what the sample knows samples, and the one ending the prompt of sample 0 forks
    (one `Sampling` per sample of `r` still to start)."""
    start = sample.n_fed
    sample.n_fed += work.n_tokens
    if work.kind == "decode":
        return Input(work.session, start, sample.tokens[-1:])
    context = r.context(sample)
    chunk = context[start : sample.n_fed]
    if sample.n_fed < len(context):
        return Input(work.session, start, chunk, sample=False)
    forks = ()
    if len(r.samples) < r.n:
        forks = tuple(r.sampling_of(Sample(i)) for i in range(len(r.samples), r.n))
    return Input(work.session, start, chunk, forks=forks)
