// Drives minfer-server with the npm `openai` client (test_server_openai): models, completions and chat,
// streamed and not, an unknown model and a wrong key. Prints one JSON object with what it saw.
// Usage: node openai_client.cjs PORT MODEL_ID API_KEY  (MINFER_OPENAI_MODULE: the package's directory)
const OpenAI = require(process.env.MINFER_OPENAI_MODULE);

async function collect(stream, field) {
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    const choice = chunk.choices[0];
    if (choice) {
      text += (field === 'text' ? choice.text : choice.delta?.content) ?? '';
      finish = choice.finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish_reason: finish, usage, chunks };
}

async function main() {
  const [port, model, key] = process.argv.slice(2);
  const baseURL = `http://127.0.0.1:${port}/v1`;
  const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0, timeout: 120000 });
  const out = {};
  out.models = (await client.models.list()).data.map((m) => m.id);

  const request = { model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
  const c = await client.completions.create(request);
  out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage, object: c.object };
  out.completion_stream = await collect(await client.completions.create({ ...request, stream: true }), 'text');

  const chat = { model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24, temperature: 0 };
  const r = await client.chat.completions.create(chat);
  out.chat = { text: r.choices[0].message.content, role: r.choices[0].message.role, finish_reason: r.choices[0].finish_reason,
               usage: r.usage, object: r.object };
  out.chat_stream = await collect(
      await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } }), 'delta');

  try {
    await client.completions.create({ ...request, model: 'no-such-model' });
    out.unknown_model = null;
  } catch (e) {
    out.unknown_model = { status: e.status, param: e.param ?? null, message: e.message };
  }
  try {
    await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).completions.create(request);
    out.wrong_key = null;
  } catch (e) {
    out.wrong_key = { status: e.status };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
