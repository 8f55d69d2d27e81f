// The real @e2b/code-interpreter JS SDK, unchanged, against a Sandbank server or a fleet's front.
// tests/e2b/test_js_sdk.py runs it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to the
// server (and E2B_SECOND_KEY, another tenant's key). Prints "ok - ..." per step, then
// "N passed, 0 failed"; a failed step throws (exit code 1).
import { Sandbox } from '@e2b/code-interpreter'
import { CommandExitError, NotFoundError, AuthenticationError, FileType } from 'e2b'

const TINY_PNG =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII='
let passed = 0
function step(name, cond = true) {
  if (!cond) throw new Error(`FAILED: ${name}`)
  passed++
  console.log('ok -', name)
}
async function raises(name, fn, check) {
  try {
    await fn()
  } catch (e) {
    step(name, check(e))
    return
  }
  step(name, false)
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const sbx = await Sandbox.create({ metadata: { suite: 'js', who: 'try sdk' }, timeoutMs: 120_000, envs: { SB_GLOBAL: 'g1' } })
step('create', sbx.sandboxId)

// --- runCode -------------------------------------------------------------------------------
let ex = await sbx.runCode('x = 41\nx + 1')
step('runCode main result', ex.text === '42' && ex.results[0].isMainResult)
step('state across calls', (await sbx.runCode('x * 2')).text === '82')

const seen = []
const t0 = Date.now()
ex = await sbx.runCode("import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n", {
  onStdout: (m) => seen.push([Date.now() - t0, m.line]),
})
step('stdout logs', ex.logs.stdout.join('') === 'tick 0\ntick 1\ntick 2\n')
step('onStdout streamed while running', seen.length >= 3 && seen.at(-1)[0] - seen[0][0] > 600)

ex = await sbx.runCode("import sys; print('to err', file=sys.stderr)")
step('stderr logs', ex.logs.stderr.join('') === 'to err\n')

ex = await sbx.runCode("def f():\n    raise ValueError('boom')\nf()")
step('exception -> execution.error', ex.error?.name === 'ValueError' && ex.error.value === 'boom' && ex.error.traceback.includes('ValueError'))

ex = await sbx.runCode(
  'import base64\n' +
    'class Chart:\n' +
    `    def _repr_png_(self): return base64.b64decode('${TINY_PNG}')\n` +
    "    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n" +
    'display(Chart())\n' +
    'Chart()'
)
const [rDisp, rMain] = ex.results
step('display() result is not main', !rDisp.isMainResult && rDisp.png === TINY_PNG)
step('png + html main result', rMain.isMainResult && Buffer.from(rMain.png, 'base64').subarray(1, 4).toString() === 'PNG' && rMain.html.startsWith('<table>')
  && rMain.formats().includes('png') && rMain.formats().includes('html') && Object.keys(rMain.extra).length === 0)

ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
step('a matplotlib chart as png', ex.results.length === 1 && Buffer.from(ex.results[0].png, 'base64').subarray(1, 4).toString() === 'PNG')
ex = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
step('a DataFrame as html', ex.results[0].isMainResult && ex.results[0].html.includes('<table'))
const errs = []
ex = await sbx.runCode("import sys; print('to err', file=sys.stderr)", { onStderr: (m) => errs.push(m.line) })
step('onStderr', errs.join('') === 'to err\n' && ex.logs.stderr.join('') === 'to err\n')

ex = await sbx.runCode("import os; os.environ.get('PER_CALL')", { envs: { PER_CALL: 'v1' } })
step('envs per runCode', ex.text === 'v1')

const ctx = await sbx.createCodeContext()
await sbx.runCode("y = 'in ctx'", { context: ctx })
step('separate context keeps its own state', (await sbx.runCode('y', { context: ctx })).text === 'in ctx' && (await sbx.runCode("'y' in dir()")).text === 'False')
step('list contexts', (await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
await sbx.restartCodeContext(ctx)
step('restart context clears it', (await sbx.runCode("'y' in dir()", { context: ctx })).text === 'False')
await sbx.removeCodeContext(ctx.id)
step('remove context', !(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
await raises('unsupported language raises', () => sbx.runCode('puts 1', { language: 'ruby' }), (e) => e.message.startsWith('500'))

// --- files ---------------------------------------------------------------------------------
const info = await sbx.files.write('/home/user/data/a.txt', 'hello')
step('files.write', info.path === '/home/user/data/a.txt' && info.name === 'a.txt')
step('files.read', (await sbx.files.read('/home/user/data/a.txt')) === 'hello')
step('files.read relative path', (await sbx.files.read('data/a.txt')) === 'hello')
step('files.read bytes', Buffer.from(await sbx.files.read('data/a.txt', { format: 'bytes' })).toString() === 'hello')
const infos = await sbx.files.write([
  { path: 'data/b.bin', data: new Uint8Array([0, 1]) },
  { path: '/home/user/data/sub/c.txt', data: 'c' },
])
step('files.write several (multipart)', JSON.stringify(infos.map((i) => i.path)) === JSON.stringify(['/home/user/data/b.bin', '/home/user/data/sub/c.txt']))
const entries = await sbx.files.list('/home/user/data')
step('files.list depth 1', entries.map((e) => e.name).sort().join() === 'a.txt,b.bin,sub' && entries.find((e) => e.name === 'sub').type === FileType.DIR)
step('files.list depth 2', (await sbx.files.list('/home/user/data', { depth: 2 })).some((e) => e.name === 'c.txt'))
step('files.getInfo', (await sbx.files.getInfo('data/a.txt')).size === 5)
step('files.makeDir new', (await sbx.files.makeDir('/home/user/newdir')) === true)
step('files.makeDir existing -> false', (await sbx.files.makeDir('/home/user/newdir')) === false)
step('files.exists', (await sbx.files.exists('data/a.txt')) && !(await sbx.files.exists('nope.txt')))
await sbx.files.rename('data/a.txt', 'data/renamed.txt')
step('files.rename', (await sbx.files.exists('data/renamed.txt')) && !(await sbx.files.exists('data/a.txt')))
await sbx.files.remove('data/renamed.txt')
step('files.remove', !(await sbx.files.exists('data/renamed.txt')))
await raises('read missing -> NotFoundError', () => sbx.files.read('/home/user/missing.txt'), (e) => e instanceof NotFoundError)

const events = []
const watcher = await sbx.files.watchDir('/home/user/data', (e) => events.push(e))
await sbx.files.write('data/watched.txt', 'w')
for (let i = 0; i < 20 && !events.some((e) => e.name === 'watched.txt'); i++) await sleep(100)
await watcher.stop()
step('files.watchDir (streaming WatchDir) sees create', events.some((e) => e.name === 'watched.txt' && e.type === 'create'))

// --- commands ------------------------------------------------------------------------------
const out = []
const r = await sbx.commands.run('echo hi; echo oops >&2; echo $SB_GLOBAL $MINE; pwd', { envs: { MINE: 'm' }, onStdout: (s) => out.push(s) })
step('commands.run foreground', r.exitCode === 0 && r.stdout.startsWith('hi\ng1 m\n') && r.stdout.trim().endsWith('/home/user') && r.stderr === 'oops\n')
step('commands.run onStdout', out.join('') === r.stdout)
await raises('non-zero exit -> CommandExitError', () => sbx.commands.run('echo before; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3 && e.stdout === 'before\n')

let h = await sbx.commands.run('sleep 30', { background: true })
step('background command has pid', h.pid > 0)
step('commands.list shows it', (await sbx.commands.list()).some((p) => p.pid === h.pid && p.cmd === '/bin/bash'))
step('commands.kill', (await sbx.commands.kill(h.pid)) === true)
await sleep(300)
step('killed command gone from list', !(await sbx.commands.list()).some((p) => p.pid === h.pid))
step('kill unknown pid -> false', (await sbx.commands.kill(999999)) === false)

h = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
await sbx.commands.sendStdin(h.pid, 'abc\n')
step('stdin to background command', (await h.wait()).stdout === 'got:abc\n')

h = await sbx.commands.run('sleep 0.3; echo late', { background: true })
const h2 = await sbx.commands.connect(h.pid)
step('commands.connect to running command', (await h2.wait()).stdout === 'late\n')

// --- lifecycle -----------------------------------------------------------------------------
await sbx.setTimeout(600_000)
const i = await sbx.getInfo()
step('getInfo', i.sandboxId === sbx.sandboxId && i.metadata.who === 'try sdk' && i.state === 'running' && i.endAt - i.startedAt > 500_000)
step('getMetrics', (await sbx.getMetrics())[0].cpuCount === 1)

const other = await Sandbox.create({ metadata: { suite: 'js', who: 'other' } })
const pager = Sandbox.list({ query: { metadata: { suite: 'js' } }, limit: 1 })
const ids = []
while (pager.hasNext) ids.push(...(await pager.nextItems()).map((s) => s.sandboxId))
step('Sandbox.list v2 paging + metadata filter', ids.sort().join() === [sbx.sandboxId, other.sandboxId].sort().join())

await sbx.runCode("kept = 'across connect'")
const back = await Sandbox.connect(sbx.sandboxId)
step('connect keeps variables', (await back.runCode('kept')).text === 'across connect')
await raises('second API key cannot see the sandbox', () => Sandbox.connect(sbx.sandboxId, { apiKey: process.env.E2B_SECOND_KEY }), (e) => e instanceof NotFoundError)
await raises('bad API key -> AuthenticationError', () => Sandbox.create({ apiKey: 'e2b_wrong' }), (e) => e instanceof AuthenticationError)

await back.runCode("paused_kept = 'across a pause'")
step('pause', (await back.pause()) === true)
step('pause again -> false (409)', (await Sandbox.pause(sbx.sandboxId)) === false)
const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
step('listed as paused', paused.some((s) => s.sandboxId === sbx.sandboxId && s.state === 'paused'))
const resumed = await Sandbox.connect(sbx.sandboxId)
step('connect resumes with the variables', (await resumed.runCode('paused_kept')).text === 'across a pause')
await other.kill()
await back.kill()
step('killed sandbox gone', !(await Sandbox.list({ query: { metadata: { suite: 'js' } } }).nextItems()).length)
step('kill again -> false', (await Sandbox.kill(sbx.sandboxId)) === false)
step('isRunning after kill', (await back.isRunning()) === false)

console.log(`${passed} passed, 0 failed`)
// exit explicitly: the JS SDK leaves a requestTimeoutMs (60 s) timer armed when runCode gets an
// error response (the unsupported-language step), which would keep node alive for a minute.
process.exit(0)
