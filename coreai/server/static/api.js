// The server's public API as the page uses it: /v1/models and streamed /v1/chat/completions (SSE).

/** An error object the server answered ({message, type, param, code}), with the HTTP status (0: in-stream). */
export class ApiError extends Error {
  constructor(status, error) {
    super(error.message);
    this.status = status;
    this.error = error;
  }
}

const headers = (key) => ({ "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) });

async function failure(response) {
  let error;
  try {
    error = (await response.json()).error;
  } catch {
    error = null;
  }
  return new ApiError(response.status, error || { message: response.statusText || "request failed", type: "http_error" });
}

/** The ids of the models the server serves. Throws ApiError. */
export async function listModels(key) {
  const response = await fetch("/v1/models", { headers: headers(key) });
  if (!response.ok) throw await failure(response);
  return (await response.json()).data.map((m) => m.id);
}

/**
 * Stream a chat completion: `onHeaders(headers)` once, then `onChunk(chunk)` for each SSE chunk.
 * Throws ApiError for an error status or an in-stream error object; an abort (`signal`) ends it quietly.
 */
export async function streamChat(body, key, { onHeaders, onChunk }, signal) {
  const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(key), body: JSON.stringify(body), signal });
  if (!response.ok) throw await failure(response);
  onHeaders(response.headers);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(0, chunk.error);
        onChunk(chunk);
      }
    }
  }
}
