"""What the `Engine` keeps of its requests and reads off them: `Requests`, every request by
id, and `next_input`, the input a running sample's next piece of work feeds."""

from numbakv.core.errors import ConfigError
from numbakv.core.values import as_int
from numbakv.serve.batch import Input
from numbakv.serve.requests import Request, Sample
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

    def totals(self) -> tuple[int, int, int, int]:
        """Every request's prompt tokens, cached tokens, recomputed tokens and preemptions,
        summed (`EngineMetrics`)."""
        requests = self.values()
        return (
            sum(len(r.prompt) for r in requests), sum(r.n_cached_tokens for r in requests),
            sum(r.n_recomputed_tokens for r in requests), sum(r.n_preemptions for r in requests),
        )  # fmt: skip

    @property
    def n_host_cached_tokens(self) -> int:
        """Every request's cached tokens reloaded from host memory, summed."""
        return sum(r.n_host_cached_tokens for r in self.values())


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
