// The AWS SDK for JavaScript v3 against the gateway, on Bedrock's four
// runtime APIs: each call's usage as the SDK read it, and what it did with
// the gateway's refusals: a throttled call raised as ThrottlingException
// (maxAttempts 1), and retried after the wait the answer gave, then
// answered (maxAttempts 3); a spent budget raised as
// ServiceQuotaExceededException, never retried. Each access key id is
// KEY-<call>, so that the gateway charges each call to a key of its own.
// Prints a JSON report.
import {
  BedrockRuntimeClient, ConverseCommand, ConverseStreamCommand, InvokeModelCommand,
  InvokeModelWithResponseStreamCommand, ThrottlingException, ServiceQuotaExceededException,
} from '@aws-sdk/client-bedrock-runtime';

const prompt = 'Price every token of this prompt exactly';
const model = 'us.anthropic.claude-sonnet-4-20250514-v1:0';

// attempts are the answers every attempt got, in order: its access key,
// status, the error code and waits it announced, and when it came.
const attempts = [];
const client = (name, maxAttempts = 3) => {
  const accessKeyId = `${process.env.KEY}-${name}`;
  const c = new BedrockRuntimeClient({
    region: 'us-east-1', endpoint: process.env.GATEWAY, maxAttempts,
    credentials: { accessKeyId, secretAccessKey: 'not-a-secret' },
  });
  const record = (response) => {
    const h = response?.headers ?? {};
    attempts.push({
      key: accessKeyId, status: response?.statusCode ?? 0, errorType: h['x-amzn-errortype'] ?? '',
      amzRetryAfter: h['x-amz-retry-after'] ?? '', retryAfter: h['retry-after'] ?? '', at: Date.now(),
    });
  };
  c.middlewareStack.add((next) => async (args) => {
    try {
      const out = await next(args);
      record(out.response);
      return out;
    } catch (e) {
      record(e.$response);
      throw e;
    }
  }, { step: 'deserialize', name: 'recordAttempts', priority: 'high' });
  return c;
};

const converse = (modelId = model) => new ConverseCommand({
  modelId, messages: [{ role: 'user', content: [{ text: prompt }] }], inferenceConfig: { maxTokens: 100 },
});
const anthropicBody = JSON.stringify({
  anthropic_version: 'bedrock-2023-05-31', max_tokens: 100, messages: [{ role: 'user', content: prompt }],
});
const decode = (bytes) => JSON.parse(new TextDecoder().decode(bytes));

// settled runs call and reports its answer (describe's fields of it) or
// the error the SDK raised, with the attempts the SDK made for it.
async function settled(call, describe) {
  const report = {};
  try {
    Object.assign(report, await describe(await call()));
  } catch (e) {
    report.error = e.name;
    report.throttling = e instanceof ThrottlingException;
    report.serviceQuotaExceeded = e instanceof ServiceQuotaExceededException;
    report.attempts = e.$metadata?.attempts ?? 0;
    report.message = e.message;
  }
  return report;
}
const metadata = (out) => ({ attempts: out.$metadata.attempts, totalRetryDelay: out.$metadata.totalRetryDelay });

const report = {};
report.converse = await settled(() => client('converse').send(converse()),
  (out) => ({ ...metadata(out), usage: out.usage, text: out.output.message.content[0].text }));
report.converseStream = await settled(() => client('stream').send(new ConverseStreamCommand({
  modelId: model, messages: [{ role: 'user', content: [{ text: prompt }] }], inferenceConfig: { maxTokens: 100 },
})), async (out) => {
  let text = '', usage;
  for await (const ev of out.stream) {
    text += ev.contentBlockDelta?.delta?.text ?? '';
    usage = ev.metadata?.usage ?? usage;
  }
  return { ...metadata(out), usage, text };
});
report.invoke = await settled(() => client('invoke').send(new InvokeModelCommand({
  modelId: model, contentType: 'application/json', accept: 'application/json', body: anthropicBody,
})), (out) => {
  const body = decode(out.body);
  return { ...metadata(out), usage: body.usage, text: body.content[0].text };
});
report.invokeStream = await settled(() => client('invokestream').send(new InvokeModelWithResponseStreamCommand({
  modelId: model, contentType: 'application/json', accept: 'application/json', body: anthropicBody,
})), async (out) => {
  let text = '', usage = {}, metrics;
  for await (const ev of out.body) {
    const chunk = decode(ev.chunk.bytes);
    text += chunk.delta?.text ?? '';
    Object.assign(usage, chunk.message?.usage ?? {}, chunk.usage ?? {});
    metrics = chunk['amazon-bedrock-invocationMetrics'] ?? metrics;
  }
  return { ...metadata(out), usage, metrics, text };
});

// throttled-model has a bucket of one request a second.
report.throttledFirst = await settled(() => client('throttled', 1).send(converse('throttled-model')), metadata);
report.throttledRaised = await settled(() => client('throttled', 1).send(converse('throttled-model')), metadata);
report.throttledRetried = await settled(() => client('throttled', 3).send(converse('throttled-model')), metadata);

// KEY-budget's day budget fits one request.
report.budgetFirst = await settled(() => client('budget').send(converse()), metadata);
report.budgetRefused = await settled(() => client('budget').send(converse()), metadata);

report.attempts = attempts;
console.log(JSON.stringify(report));
