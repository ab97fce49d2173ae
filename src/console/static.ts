/**
 * The console's only script: it follows the run page's open streams, asking for the chunks
 * after the last one shown once a second until the stream is closed. Plain JS, no build.
 */
export const STREAMS_JS = `
for (const pre of document.querySelectorAll('pre[data-stream]')) {
  let next = Number(pre.dataset.next);
  if (pre.dataset.closed) continue;
  const url = '/runs/' + encodeURIComponent(pre.dataset.run) + '/streams/' + encodeURIComponent(pre.dataset.stream);
  const poll = async () => {
    try {
      const answer = await (await fetch(url + '?from=' + next, { cache: 'no-store' })).json();
      for (const c of answer.chunks) {
        pre.append(typeof c.chunk === 'string' ? c.chunk : JSON.stringify(c.chunk) + '\\n');
        next = c.offset + 1;
      }
      pre.scrollTop = pre.scrollHeight;
      if (answer.closed && answer.chunks.length === 0) return;
    } catch (error) {
      // the console restarted or the network dropped: try again on the next tick
    }
    setTimeout(poll, 1000);
  };
  setTimeout(poll, 1000);
}
`;
