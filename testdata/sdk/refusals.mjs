// What the budget scripts share: a fetch for an SDK's options that records
// every response the SDK got from the gateway, and the report of one call
// the gateway is to refuse.

// recordingFetch records, of each response, its status, the headers that
// tell an SDK whether and when to retry, and when it came (unix
// milliseconds).
export function recordingFetch() {
  const responses = [];
  const recording = async (url, init) => {
    const res = await fetch(url, init);
    responses.push({
      status: res.status,
      retryAfter: res.headers.get('retry-after') ?? '',
      retryAfterMs: res.headers.get('retry-after-ms') ?? '',
      shouldRetry: res.headers.get('x-should-retry') ?? '',
      at: Date.now(),
    });
    return res;
  };
  return { fetch: recording, responses };
}

// refused runs call, which the gateway is to refuse, and reports what the
// SDK raised (the error's class name and describe's fields of it), the
// responses its fetch got meanwhile (one: it did not retry), and the clock
// before and after (unix milliseconds). call gets an abort signal that
// ends an SDK's wait to retry after 20 s (aborted), rather than the wait
// until the budget renews.
export async function refused(responses, call, describe) {
  const from = responses.length;
  const report = { start: Date.now() };
  const signal = AbortSignal.timeout(20_000);
  try {
    await call(signal);
    report.refused = false;
  } catch (e) {
    report.refused = true;
    report.name = e.constructor?.name ?? '';
    Object.assign(report, describe(e));
  }
  report.end = Date.now();
  report.aborted = signal.aborted;
  report.responses = responses.slice(from);
  return report;
}
