# Writes the seed inputs of fuzz/corpus/ (run from the repository root: python3 fuzz/make_seeds.py).
# Inputs that crashed a target once are kept there too, by hand, as regression tests.
import os, struct, ssl, json
root = 'fuzz/corpus'
def put(target, name, data):
    d = os.path.join(root, target); os.makedirs(d, exist_ok=True)
    if isinstance(data, str): data = data.encode()
    open(os.path.join(d, name), 'wb').write(data)

# api_request
E = '/v1/environments/0123456789ab'
api = {
 'create': 'POST /v1/environments\n\n' + json.dumps({"task_id":"t1","spec":{"cpus":1.5,"ram_mb":512,"storage_gb":2,"pids":64},"ttl_s":600,"labels":{"team":"x"},"env":{"A":"b"},"permissions":{"run_command":[{"match":["rm","*"],"action":"deny"},{"action":"allow"}],"network":"ask"},"network":{"mode":"allowlist","allow":["pypi.org",{"host":"api.github.com","methods":["GET"],"paths":["/repos/**"]}]},"secrets":[{"name":"TOKEN","value":"s3cr3t","hosts":["api.github.com"],"header":"Authorization: Bearer {value}"}]}),
 'create-key': 'POST /v1/environments\nAuthorization: Bearer $KEY\n\n{"template":"/srv/root","permissions":{"network":"ask"}}',
 'create-plain': 'POST /v1/environments\n\n{"network":"none"}',
 'list': 'GET /v1/environments?label=a%3Db&state=running&task_id=x\n\n',
 'exec': 'POST ' + E + '/exec\n\n{"cmd":["sh","-c","echo hi"],"timeout_ms":1000,"env":{"X":"1"},"cwd":"/workspace","stdin":"aGk=","encoding":"base64","output_limit":100}',
 'process': 'POST ' + E + '/processes\nPrefer: respond-async\n\n{"cmd":["python3"],"pty":true,"rows":40,"cols":100,"stdin":true,"timeout_ms":5000}',
 'stdin': 'POST ' + E + '/processes/1/stdin\n\n{"data":"aGk=","encoding":"base64","close":true}',
 'signal': 'POST ' + E + '/processes/1/signal\n\n{"signal":"TERM"}',
 'resize': 'POST ' + E + '/processes/1/resize\n\n{"rows":10,"cols":20}',
 'output': 'GET ' + E + '/processes/1/output?since=10&follow=1\n\n',
 'write': 'PUT ' + E + '/files?path=%2Fworkspace%2Fa.txt&mode=0600&append=1\n\nhello',
 'read': 'GET ' + E + '/files?path=/etc/passwd&offset=10&length=5\n\n',
 'remove': 'DELETE ' + E + '/files?path=/tmp&recursive=true\n\n',
 'mkdir': 'POST ' + E + '/files/mkdir\n\n{"path":"/w/x","parents":true}',
 'move': 'POST ' + E + '/files/move\n\n{"from":"/a","to":"/b/../c"}',
 'stat': 'GET ' + E + '/files/stat?path=/a\n\n',
 'permissions': 'PUT ' + E + '/permissions\n\n{"permissions":{"read_file":[{"path":"/etc/**","action":"deny"},{"action":"allow"}]},"replace":true}',
 'network': 'PUT ' + E + '/network\n\n{"network":{"mode":"open","deny":["10.0.0.0/8"],"max_connections":4,"bandwidth_mbps":1.5}}',
 'approve': 'POST /v1/approvals/0123456789ab\n\n{"decision":"approve","reason":"ok","remember":true}',
 'approvals': 'GET /v1/approvals?state=pending&environment=0123456789ab\n\n',
 'timeout': 'POST ' + E + '/timeout\n\n{"ttl_s":60}',
 'destroy': 'DELETE ' + E + '\nAuthorization: Bearer $KEY\n\n',
 'shell': 'GET ' + E + '/shell?rows=24&cols=80\n\n',
}
for k, v in api.items(): put('api_request', k, v)

# permissions
perm = {
 'rules': json.dumps({"read_file":[{"path":"/etc/**","action":"deny"},{"path":"/workspace/*.py","action":"ask"},{"action":"allow"}],
   "write_file":"ask","run_command":[{"match":["git","push","*"],"action":"ask"},{"match":["rm","-rf","*"],"action":"deny"},{"action":"allow"}],
   "network":[{"host":"*.github.com","port":443,"action":"allow"},{"action":"deny"}]}) +
   '\nr /etc/../etc/shadow\nw /workspace/a.py\nx git\tpush\torigin\nx /usr/bin/rm\t-rf\t/\nn api.github.com:443\nn evil.com:80\ng /a/**/b\t/a/x/y/b',
 'words': '{"read_file":"allow","write_file":"deny","run_command":"ask","network":"allow"}\nr /a\nw /b\nx ls\nn x.org',
 'escapes': '{"read_file":[{"path":"/data/\\\\*star","action":"deny"},{"path":"/data/?","action":"ask"},{"action":"allow"}]}\nr /data/*star\nr /data/x\nr //data/./x/',
}
for k, v in perm.items(): put('permissions', k, v)

# egress_policy
eg = {
 'allowlist': json.dumps({"mode":"allowlist","allow":["pypi.org","*.pythonhosted.org:443","10.1.0.0/16",{"host":"api.github.com","ports":[443],"methods":["GET","post"],"paths":["/repos/**"]}],"deny":["169.254.169.254",{"host":"api.github.com","paths":["/admin/**"]}],"max_connections":8,"bandwidth_mbps":10}) + '\n' +
   json.dumps([{"name":"GH","value":"ghp_123","hosts":["api.github.com"],"header":"Authorization: token {value}"},{"name":"K2","value":"v2","hosts":["*.example.com"]}]) +
   '\nd pypi.org 443 151.101.0.223 - /\nd api.github.com 443 - GET /repos/a/../../admin/x\nd api.github.com 443 - GET /repos/%2e%2e/admin\nd 10.1.2.3 80 10.1.2.3 - /\nd metadata 80 169.254.169.254 GET /latest\nd x.pythonhosted.org. 443 - - /\n'
   's api.github.com Bearer $0 and $1\ns evil.com $0\ns a.example.com $1',
 'open': '"open"\n[]\nd anything.com 80 1.2.3.4 GET /x\nd localhost 80 127.0.0.1 GET /\n',
 'none': '{"mode":"none"}\n[]\nd a.com 80 - - /',
}
for k, v in eg.items(): put('egress_policy', k, v)

# path_resolution
for i, p in enumerate(['/a/b/../f', '/a/./b//c/', '/../../a/b/c/../../f', '/a/b/c/%2e%2e', '/...', '/..a/../f', '', 'a/x/../f', '/e e/', '/d/a/f/..', '/.b/../d/./a']):
    put('path_resolution', 'p%d' % i, p)

# proxy_http
heads = [
 b'\x00GET http://example.com:8080/x?y=1 HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\n\r\n',
 b'\x00POST http://api.github.com/repos HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: 5\r\nProxy-Authorization: Basic x\r\n\r\nhello',
 b'\x01POST /upload HTTP/1.1\r\nHost: pypi.org\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\nhello\r\n0\r\n\r\n',
 b'\x01GET /chat HTTP/1.1\r\nHost: ws.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n',
 b'\x01GET / HTTP/1.1\r\nHost: h2.example.com\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 0\r\n\r\n',
 b'\x02PUT /a%2F..%2Fb;x=1 HTTP/1.1\r\nHost: EXAMPLE.com.\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc',
 b'\x02GET /x HTTP/1.0\r\n\r\n',
]
for i, h in enumerate(heads): put('proxy_http', 'head%d' % i, h)
# A real ClientHello (Python's OpenSSL), with SNI.
ctx = ssl.create_default_context()
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
s = ctx.wrap_bio(inc, out, server_hostname='Files.PythonHosted.org')
try: s.do_handshake()
except ssl.SSLWantReadError: pass
hello = out.read()
put('proxy_http', 'clienthello', b'\x03' + hello)
# The same split over two handshake records.
body = hello[5:]
rec = lambda b: b'\x16\x03\x01' + struct.pack('>H', len(b)) + b
put('proxy_http', 'clienthello-split', b'\x03' + rec(body[:40]) + rec(body[40:]))
def q(name, qtype=1, qid=0x1234, flags=0x0100):
    wire = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.') if l) + b'\x00'
    return struct.pack('>HHHHHH', qid, flags, 1, 0, 0, 0) + wire + struct.pack('>HH', qtype, 1)
put('proxy_http', 'dns-a', b'\x04' + q('pypi.org'))
put('proxy_http', 'dns-aaaa', b'\x04' + q('Files.PythonHosted.org', 28))
m = q('a.b.c'); m2 = q('x_y.example', flags=0x2800)
put('proxy_http', 'dns-tcp', b'\x04' + struct.pack('>H', len(m)) + m + struct.pack('>H', len(m2)) + m2)
put('proxy_http', 'dns-response', b'\x04' + q('a.org', flags=0x8180))

# init_protocol
u8 = lambda v: struct.pack('<B', v)
u32 = lambda v: struct.pack('<I', v & 0xffffffff)
u64 = lambda v: struct.pack('<Q', v)
by = lambda b: u32(len(b)) + (b.encode() if isinstance(b, str) else b)
strs = lambda l: u32(len(l)) + b''.join(by(x) for x in l)
frame = lambda t, p: u32(len(p) + 1) + u8(t) + p
spawn = u32(1) + strs(['sh', '-c', 'echo hi']) + strs(['PATH=/usr/bin', 'HOME=/root']) + by('/workspace') + u32(0) + u32(0) + u8(3) + u64(1000) + u64(1 << 20)
filereq = u32(9) + u8(2) + by('/workspace/a') + by('') + by('data') + u64(0) + u64(0) + u32(0o644) + u8(1)
info = lambda n: by(n) + u8(ord('f')) + u64(4) + u32(0o644) + u64(1700000000)
fileres = u32(9) + u32(0) + by('') + by('data') + info('a') + u32(2) + info('x') + info('y')
exited = u32(1) + u32(0) + u32(0) + u8(5) + u64(10) + u64(0) + u64(1234)
put('init_protocol', 'client', frame(1, spawn) + frame(2, u32(1) + by('input')) + frame(3, u32(1)) + frame(4, u32(1) + u32(15) + u8(1)) + frame(5, u32(1) + u32(24) + u32(80)) + frame(16, filereq) + frame(6, b''))
put('init_protocol', 'init', frame(64, u32(1) + u32(1)) + frame(65, u32(1) + u32(42)) + frame(66, u32(2) + u32(2) + by('exec')) + frame(67, u32(1) + u8(1) + by('out')) + frame(68, exited) + frame(80, fileres) + frame(81, by('bad')))
put('init_protocol', 'spawn', spawn)

# mcp
mcp = {
 'init': '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}',
 'list': '{"jsonrpc":"2.0","id":"a","method":"tools/list"}',
 'run': '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"ls -la","timeout_s":5,"stdin":"x"},"_meta":{"progressToken":"p"}}}\ntotal 0\n\xc3\xa9t\xc3\xa9 \xe2\x82\xac\n',
 'argv': '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"start_process","arguments":{"argv":["python3","-m","http.server"],"cwd":"src"}}}',
 'read': '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt","start_line":2,"end_line":3}}}\nl1\nl2\nl3\nl4',
 'edit': '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"edit_file","arguments":{"path":"/w/a","old_string":"l2","new_string":"L2","replace_all":true}}}\nl1\nl2\nl2',
 'search': '{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"search_files","arguments":{"pattern":"TODO","glob":"*.py"}}}\na.py:1:# TODO\n',
 'create': '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_environment","arguments":{"cpus":2,"ram_mb":512,"labels":{"a":"b"},"network":{"mode":"allowlist","allow":["pypi.org"]}}}}',
 'net': '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"set_network_policy","arguments":{"environment_id":"0123456789ab","network":"open"}}}',
 'kill': '{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"kill_process","arguments":{"process_id":7,"signal":"KILL"}}}',
 'readout': '{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"read_process_output","arguments":{"process_id":7,"since":0,"wait_s":0.5}}}\nout',
 'input': '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"send_input","arguments":{"process_id":7,"input":"hi\\n","close":true}}}',
 'resources': '{"jsonrpc":"2.0","id":12,"method":"resources/read","params":{"uri":"moat://environments/0123456789ab/events"}}\n{"type":"environment.created"}',
 'cancel': '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}',
 'response': '{"jsonrpc":"2.0","id":99,"result":{}}',
 'write': '{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"x/y","content":"z"}}}',
 'destroy': '{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"destroy_environment","arguments":{"environment_id":"0123456789ab"}}}',
}
for k, v in mcp.items(): put('mcp', k, v.encode('latin-1') if '\xc3' in v else v)
