#include "cli/client.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/exit_codes.h"
#include "common/encoding.h"
#include "common/path.h"
#include "os/file.h"
#include "os/tree.h"

namespace moat::cli {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace asio = boost::asio;

constexpr const char* kDefaultState = "/var/lib/moat";
// Exec answers carry up to 16 MiB per stream, base64 makes that ~22 MiB.
constexpr uint64_t kMaxReplyBytes = 256u << 20;

std::string fromEnvironment(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

template <class Stream>
Result<HttpReply> exchange(Stream& stream, const Endpoint& endpoint, const std::string& method,
                           const std::string& target, const std::string& body, const std::string& token) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, endpoint.transport == Endpoint::Transport::kUnix
                                 ? std::string("localhost")
                                 : endpoint.host + ":" + std::to_string(endpoint.port));
  req.set(http::field::user_agent, "moat-cli");
  req.set(http::field::authorization, "Bearer " + token);
  req.keep_alive(false);
  if (!body.empty() || method == "POST" || method == "PUT") {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  beast::error_code ec;
  http::write(stream, req, ec);
  if (ec) return Error::make(Code::kIo, "sending the request to moatd at " + endpoint.display() + ": " + ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxReplyBytes);
  http::read(stream, buffer, parser, ec);
  if (ec) {
    return Error::make(Code::kIo, "reading moatd's answer from " + endpoint.display() + ": " + ec.message());
  }
  HttpReply reply;
  reply.status = parser.get().result_int();
  reply.body = std::move(parser.get().body());
  for (const auto& field : parser.get()) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.rfind("x-moat-", 0) == 0) reply.headers[name] = std::string(field.value());
  }
  return reply;
}

// How long a stream may stay silent: moatd's streams send a heartbeat every
// 15 s, so three missed ones mean the connection is lost (a network that
// drops packets without a reset); $MOAT_STREAM_IDLE_S overrides it.
std::chrono::seconds streamIdleLimit() {
  std::string v = fromEnvironment("MOAT_STREAM_IDLE_S");
  if (!v.empty() && v.size() <= 6 && v.find_first_not_of("0123456789") == std::string::npos && std::stoul(v) > 0) {
    return std::chrono::seconds(std::stoul(v));
  }
  return std::chrono::seconds(45);
}

// Shuts a connection down once nothing arrived on it for `limit`: the
// blocking read on it then ends.
class IdleWatch {
 public:
  IdleWatch(int fd, std::chrono::seconds limit) : fd_(fd), limit_(limit), thread_([this] { run(); }) {}
  ~IdleWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void alive() {
    std::lock_guard<std::mutex> lock(mutex_);
    last_ = std::chrono::steady_clock::now();
  }
  // Between reads: the time our own reader takes (a paused pager, say) is
  // not the connection's silence.
  void busy(bool b) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = b;
      last_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
  }
  bool fired() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fired_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      if (busy_) {
        cv_.wait(lock);
        continue;
      }
      auto deadline = last_ + limit_;
      if (std::chrono::steady_clock::now() >= deadline) {
        fired_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        return;
      }
      cv_.wait_until(lock, deadline);
    }
  }
  int fd_;
  std::chrono::seconds limit_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  bool done_ = false;
  bool busy_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: starts once the rest is set
};

template <class Stream>
Result<HttpReply> streamExchange(Stream& stream, const Endpoint& endpoint, const std::string& target,
                                 const std::string& token, const std::function<bool(const std::string&)>& onData) {
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, endpoint.transport == Endpoint::Transport::kUnix
                                 ? std::string("localhost")
                                 : endpoint.host + ":" + std::to_string(endpoint.port));
  req.set(http::field::user_agent, "moat-cli");
  req.set(http::field::authorization, "Bearer " + token);
  req.keep_alive(false);
  beast::error_code ec;
  http::write(stream, req, ec);
  if (ec) return Error::make(Code::kIo, "sending the request to moatd at " + endpoint.display() + ": " + ec.message());
  const auto idleLimit = streamIdleLimit();
  IdleWatch watch(stream.native_handle(), idleLimit);
  auto lost = [&](const std::string& what, const beast::error_code& ec) {
    if (watch.fired()) {
      return Error::make(Code::kIo, "moatd at " + endpoint.display() + " sent nothing for " +
                                        std::to_string(idleLimit.count()) +
                                        " s, not even a heartbeat: the connection is taken for lost");
    }
    return Error::make(Code::kIo, what + ec.message());
  };
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);  // a stream has no end in sight
  http::read_header(stream, buffer, parser, ec);
  if (ec) return lost("reading moatd's answer from " + endpoint.display() + ": ", ec);
  HttpReply reply;
  reply.status = parser.get().result_int();
  char piece[64 << 10];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    // read_some: hand over what arrived, do not wait for a full buffer.
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return lost("the stream from moatd at " + endpoint.display() + " broke: ", ec);
    watch.alive();
    size_t n = sizeof piece - parser.get().body().size;
    if (n == 0) continue;
    if (reply.status != 200) {
      if (reply.body.size() < (1u << 20)) reply.body.append(piece, n);
      continue;
    }
    watch.busy(true);
    bool more = onData(std::string(piece, n));
    watch.busy(false);
    if (!more) break;
  }
  return reply;
}

template <class Stream>
Result<Client::Upgraded> upgrade(Stream& stream, const Endpoint& endpoint, const std::string& target,
                                 const std::string& token) {
  unsigned char nonce[16] = {};
  if (::getrandom(nonce, sizeof nonce, 0) != sizeof nonce) return Error::fromErrno("getrandom");
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, endpoint.transport == Endpoint::Transport::kUnix
                                 ? std::string("localhost")
                                 : endpoint.host + ":" + std::to_string(endpoint.port));
  req.set(http::field::user_agent, "moat-cli");
  req.set(http::field::authorization, "Bearer " + token);
  req.set(http::field::upgrade, "websocket");
  req.set(http::field::connection, "Upgrade");
  req.set(http::field::sec_websocket_version, "13");
  req.set(http::field::sec_websocket_key, base64Encode(std::string(reinterpret_cast<char*>(nonce), sizeof nonce)));
  beast::error_code ec;
  http::write(stream, req, ec);
  if (ec) return Error::make(Code::kIo, "sending the request to moatd at " + endpoint.display() + ": " + ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1u << 20);
  http::read_header(stream, buffer, parser, ec);
  if (ec) return Error::make(Code::kIo, "reading moatd's answer from " + endpoint.display() + ": " + ec.message());
  if (parser.get().result_int() != 101) {
    http::read(stream, buffer, parser, ec);  // the error body
    HttpReply reply{static_cast<int>(parser.get().result_int()), parser.get().body()};
    return Error::make(Code::kRefused, describeError(reply));
  }
  Client::Upgraded out;
  out.pending.assign(static_cast<const char*>(buffer.data().data()), buffer.data().size());
  out.fd.reset(stream.release());
  return out;
}

Error unreachable(const Endpoint& endpoint, const beast::error_code& ec) {
  std::string why = " (is moatd running?)";
  if (endpoint.transport == Endpoint::Transport::kUnix && ec == boost::system::errc::permission_denied) {
    // Not "is it running": it is, and this user may not connect.
    why =
        ": only root and the members of the group moatd's --socket-group names may connect (the package's: "
        "moat). Ask an administrator for both: adduser $USER moat, and a key: moat keys create --for-user "
        "$USER --scope ... (docs/INSTALL.md); or reach moatd over TCP with MOAT_URL and MOAT_TOKEN";
  }
  return Error::make(Code::kUnreachable, "cannot reach moatd at " + endpoint.display() + ": " + ec.message() + why);
}

}  // namespace

std::string Endpoint::display() const {
  if (transport == Transport::kUnix) return "unix:" + path;
  bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> parseEndpoint(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return usageError("--url: " + why + " (expected http://HOST:PORT or unix:/path/to.sock), got '" + url + "'");
  };
  Endpoint e;
  if (url.rfind("unix:", 0) == 0) {
    e.transport = Endpoint::Transport::kUnix;
    e.path = url.substr(5);
    if (e.path.rfind("//", 0) == 0) e.path = e.path.substr(2);  // unix:///path
    if (e.path.empty() || e.path[0] != '/') return bad("the socket path must be absolute");
    return e;
  }
  if (url.rfind("http://", 0) != 0) {
    return bad(url.rfind("https://", 0) == 0 ? "moatd serves plain HTTP" : "unknown scheme");
  }
  std::string rest = url.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) return bad("no path after the port");
  std::string portText;
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return bad("needs a port");
    }
    e.host = rest.substr(1, close - 1);
    portText = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string::npos) return bad("needs a port");
    e.host = rest.substr(0, colon);
    portText = rest.substr(colon + 1);
  }
  if (e.host.empty()) return bad("needs a host");
  if (portText.empty() || portText.size() > 5 || portText.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(portText) == 0 || std::stoul(portText) > 65535) {
    return bad("the port must be 1 to 65535");
  }
  // No name lookup: moat is linked statically, and glibc's resolver then
  // needs the very shared libraries static linking avoids.
  boost::system::error_code ec;
  if (e.host != "localhost" && (asio::ip::make_address(e.host, ec), ec)) {
    return bad("HOST must be an IP address or localhost");
  }
  e.transport = Endpoint::Transport::kTcp;
  e.port = static_cast<uint16_t>(std::stoul(portText));
  return e;
}

namespace {

// The user's token file, read only if it is what it should be: a regular
// file (no link, no FIFO to hang on), the caller's, and no one else's to read.
Result<std::string> ownToken(const std::string& path) {
  MOAT_ASSIGN(UniqueFd fd, os::open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  MOAT_ASSIGN(struct stat st, os::statFd(fd.get()));
  if (!S_ISREG(st.st_mode)) return Error::make(Code::kInsecure, path + " is not a regular file");
  if (st.st_uid != ::geteuid())
    return Error::make(Code::kInsecure, path + " is not yours (uid " + std::to_string(st.st_uid) + ")");
  if ((st.st_mode & 077) != 0) return Error::make(Code::kInsecure, path + " may be read by others: chmod 600 it");
  MOAT_ASSIGN(auto bytes, os::readUpTo(fd.get(), 4096));
  return bytes.data;
}

}  // namespace

std::string userTokenPath() {
  std::string config = fromEnvironment("XDG_CONFIG_HOME");
  if (config.empty() || config[0] != '/') {
    std::string home = fromEnvironment("HOME");
    if (home.empty() || home[0] != '/') return "";
    config = home + "/.config";
  }
  return config + "/moat/token";
}

Result<Client> Client::fromOptions(const ConnectionOptions& options) {
  std::string state = !options.stateDir.empty() ? options.stateDir : fromEnvironment("MOAT_STATE");
  if (state.empty()) state = kDefaultState;
  std::string url = !options.url.empty() ? options.url : fromEnvironment("MOAT_URL");
  Endpoint endpoint;
  if (url.empty()) {
    endpoint.path = state + "/moatd.sock";
  } else {
    auto parsed = parseEndpoint(url);
    if (!parsed.ok()) {
      // The variable, not a flag, may be what is wrong.
      if (options.url.empty()) return usageError("MOAT_URL" + parsed.error().context.substr(5));
      return parsed.error();
    }
    endpoint = parsed.value();
  }
  std::string token = !options.token.empty() ? options.token : fromEnvironment("MOAT_TOKEN");
  if (!token.empty()) return Client(endpoint, token);
  // The user's own key (moat keys create --for-user puts it there), else
  // the master token (root's). Root takes the master token when it can: a
  // HOME or XDG_CONFIG_HOME of another user's (kept by sudo -E, su without
  // -) must not make root act with that user's key.
  std::string userFile = userTokenPath();
  std::string tokenFile = state + "/master-token";
  bool own = !userFile.empty() && (os::exists(userFile) || os::isSymlink(userFile));
  if (own && ::geteuid() == 0 && os::exists(tokenFile)) own = false;
  Result<std::string> text = own ? ownToken(userFile) : os::readFile(tokenFile, 4096);
  if (own) {
    if (!text.ok() && text.error().code == Code::kInsecure) return Client(endpoint, text.error());
    tokenFile = userFile;
  }
  if (!text.ok()) {
    const Error& e = text.error();
    std::string why = e.sysErrno != 0 ? std::strerror(e.sysErrno) : e.message();
    return Client(endpoint,
                  Error::make(Code::kNoToken, "no token for moatd: pass --token, set MOAT_TOKEN, put a key in " +
                                                  (userFile.empty() ? "~/.config/moat/token" : userFile) +
                                                  " (moat keys create --for-user), or make " + tokenFile +
                                                  " readable (" + why + ")"));
  }
  token = text.value();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (token.empty()) {
    return Client(endpoint, Error::make(Code::kNoToken, "no token for moatd: " + tokenFile + " is empty"));
  }
  return Client(endpoint, token);
}

Client::Client(Endpoint endpoint, Result<std::string> token)
    : endpoint_(std::move(endpoint)), token_(std::move(token)) {}

namespace {

// Connects to moatd (unix socket or TCP) and hands the connected socket and
// the token to `talk`: every kind of call shares how moatd is reached and
// how failing to reach it is reported.
template <class R, class Talk>
Result<R> talkToMoatd(const Endpoint& endpoint, const Result<std::string>& token, Talk&& talk) {
  try {
    asio::io_context io;
    beast::error_code ec;
    if (endpoint.transport == Endpoint::Transport::kUnix) {
      asio::local::stream_protocol::socket socket(io);
      if (endpoint.path.size() >= sizeof(sockaddr_un::sun_path)) {
        return Error::make(Code::kUnreachable,
                           "cannot reach moatd at " + endpoint.display() + ": the socket path is too long");
      }
      socket.connect(asio::local::stream_protocol::endpoint(endpoint.path), ec);
      if (ec) return unreachable(endpoint, ec);
      if (!token.ok()) return token.error();
      return talk(socket, token.value());
    }
    asio::ip::tcp::socket socket(io);
    std::string host = endpoint.host == "localhost" ? "127.0.0.1" : endpoint.host;
    auto address = asio::ip::make_address(host, ec);
    if (ec) return unreachable(endpoint, ec);
    socket.connect(asio::ip::tcp::endpoint(address, endpoint.port), ec);
    if (ec) return unreachable(endpoint, ec);
    if (!token.ok()) return token.error();
    return talk(socket, token.value());
  } catch (const std::exception& e) {
    return Error::make(Code::kIo, "talking to moatd at " + endpoint.display() + ": " + e.what());
  }
}

}  // namespace

Result<Client::Upgraded> Client::openWebSocket(const std::string& target) {
  return talkToMoatd<Upgraded>(endpoint_, token_, [&](auto& socket, const std::string& token) {
    return upgrade(socket, endpoint_, target, token);
  });
}

Result<HttpReply> Client::request(const std::string& method, const std::string& target, const std::string& body) {
  return talkToMoatd<HttpReply>(endpoint_, token_, [&](auto& socket, const std::string& token) {
    return exchange(socket, endpoint_, method, target, body, token);
  });
}

Result<HttpReply> Client::stream(const std::string& target, const std::function<bool(const std::string&)>& onData) {
  return talkToMoatd<HttpReply>(endpoint_, token_, [&](auto& socket, const std::string& token) {
    return streamExchange(socket, endpoint_, target, token, onData);
  });
}

Result<nlohmann::json> call(Client& client, const std::string& method, const std::string& target,
                            const std::string& body, int expect) {
  using json = nlohmann::json;
  MOAT_ASSIGN(HttpReply reply, client.request(method, target, body));
  if (reply.status != expect) return Error::make(Code::kApi, describeError(reply));
  if (reply.body.empty()) return json();
  json j = json::parse(reply.body, nullptr, false);
  if (j.is_discarded()) return Error::make(Code::kApi, "moatd answered with something that is not JSON");
  return j;
}

std::string describeError(const HttpReply& reply) {
  auto j = nlohmann::json::parse(reply.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const auto& e = j["error"];
    auto text = [&](const char* key) {
      return e.contains(key) && e[key].is_string() ? e[key].get<std::string>() : std::string();
    };
    std::string message = text("message");
    std::string code = text("code");
    std::string field = text("field");
    if (message.empty()) message = "HTTP " + std::to_string(reply.status);
    std::string out = message + " (" + (code.empty() ? "error" : code);
    if (!field.empty()) out += ", field " + field;
    return out + ")";
  }
  std::string body = reply.body.substr(0, 200);
  for (char& c : body) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return "moatd answered HTTP " + std::to_string(reply.status) + (body.empty() ? "" : ": " + body);
}

std::string urlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// The same rules as moatd's (src/api/api.cc), which decides what it will
// accept as "utf8"; duplicated because moat does not link the daemon.

// --- flags -------------------------------------------------------------------

Error usageError(const std::string& message) { return Error::make(Code::kUsage, message); }

bool FlagReader::currentIsFlag() const {
  const std::string& a = current();
  return a.size() > 1 && a[0] == '-' && a != "--";
}

Status FlagReader::next() {
  std::string arg = args_[index_++];
  hasInline_ = false;
  inlineValue_.clear();
  if (arg.compare(0, 2, "--") == 0) {
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      inlineValue_ = arg.substr(eq + 1);
      hasInline_ = true;
      arg = arg.substr(0, eq);
      if (inlineValue_.empty()) return usageError(arg + " needs a value after '='");
    }
  }
  name_ = arg;
  return {};
}

Result<std::string> FlagReader::value() {
  if (hasInline_) return inlineValue_;
  if (index_ >= args_.size()) return usageError(name_ + " needs a value");
  return args_[index_++];
}

Status FlagReader::noValue() const {
  if (hasInline_) return usageError(name_ + " takes no value");
  return {};
}

std::vector<std::string> FlagReader::rest() const {
  return std::vector<std::string>(args_.begin() + static_cast<std::ptrdiff_t>(std::min(index_, args_.size())),
                                  args_.end());
}

Status parseArgs(const std::vector<std::string>& args, Parsed& out,
                 const std::function<Status(FlagReader&, bool&)>& handle) {
  FlagReader flags(args);
  while (!flags.done()) {
    if (flags.current() == "--") {
      flags.skip();
      for (const auto& a : flags.rest()) out.positional.push_back(a);
      break;
    }
    if (!flags.currentIsFlag()) {
      out.positional.push_back(flags.current());
      flags.skip();
      continue;
    }
    MOAT_TRY(flags.next());
    const std::string& name = flags.name();
    if (name == "-h" || name == "--help") {
      MOAT_TRY(flags.noValue());
      out.help = true;
      return {};
    }
    if (name == "--json") {
      MOAT_TRY(flags.noValue());
      out.json = true;
      continue;
    }
    bool matched = false;
    if (handle) MOAT_TRY(handle(flags, matched));
    if (!matched) MOAT_TRY(readConnectionFlag(flags, out.connection, matched));
    if (!matched) return unknownOption(name);
  }
  return {};
}

Error unknownOption(const std::string& name) {
  static const std::map<std::string, std::string> kMeant = {
      {"--cpu", "--cpus"},     {"--mem", "--memory"},         {"--ram", "--memory"},     {"--ram-mb", "--memory"},
      {"--disk", "--storage"}, {"--storage-gb", "--storage"}, {"--image", "--template"}, {"--ttl-s", "--ttl"},
      {"--pid", "--pids"},     {"--labels", "--label"},       {"--envs", "--env"},
  };
  auto meant = kMeant.find(name);
  return usageError("unknown option " + name + (meant == kMeant.end() ? "" : " (did you mean " + meant->second + "?)"));
}

std::optional<nlohmann::json> callOne(const std::vector<std::string>& args, const OneResource& what, Parsed& parsed,
                                      int& code) {
  code = 0;
  Status s = parseArgs(args, parsed, nullptr);
  if (s.ok() && !parsed.help && parsed.positional.size() != 1) {
    s = usageError(parsed.positional.empty() ? what.missing : what.several);
  }
  if (!s.ok() || parsed.help) {
    code = s.ok() ? what.help() : reportFailure(what.command, s.error());
    return std::nullopt;
  }
  auto path = what.pathOf(parsed.positional[0]);
  if (!path.ok()) {
    code = reportFailure(what.command, path.error());
    return std::nullopt;
  }
  auto client = Client::fromOptions(parsed.connection);
  if (!client.ok()) {
    code = reportFailure(what.command, client.error());
    return std::nullopt;
  }
  auto answer = call(client.value(), what.method, path.value(), "", 200);
  if (!answer.ok()) {
    code = reportFailure(what.command, answer.error());
    return std::nullopt;
  }
  if (parsed.json) {
    std::puts(answer->dump(2).c_str());
    return std::nullopt;
  }
  return answer.value();
}

int deleteEach(Client& client, const std::string& command, const std::vector<std::string>& names,
               const std::function<Result<std::string>(const std::string&)>& pathOf) {
  int code = 0;
  for (const auto& name : names) {
    auto path = pathOf(name);
    auto done = path.ok() ? call(client, "DELETE", path.value(), "", 204) : Result<nlohmann::json>(path.error());
    if (!done.ok()) {
      code = reportFailure(command, done.error());
      continue;
    }
    std::puts(name.c_str());
  }
  return code;
}

Status readConnectionFlag(FlagReader& flags, ConnectionOptions& options, bool& matched) {
  matched = true;
  const std::string& name = flags.name();
  if (name == "--url") {
    MOAT_ASSIGN(options.url, flags.value());
    MOAT_TRY(parseEndpoint(options.url));
  } else if (name == "--state") {
    MOAT_ASSIGN(std::string v, flags.value());
    if (v.empty() || v[0] != '/') return usageError("--state: must be an absolute path: " + v);
    options.stateDir = moat::normalizePath(v);
  } else if (name == "--token") {
    MOAT_ASSIGN(options.token, flags.value());
  } else {
    matched = false;
  }
  return {};
}

Result<double> parseNumber(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
    return usageError(flag + ": '" + value + "' is not a number");
  }
  return v;
}

Result<uint64_t> parseWhole(const std::string& flag, const std::string& value) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) {
    return usageError(flag + ": '" + value + "' is not a whole number");
  }
  if (value.size() > 15) return usageError(flag + ": " + value + " is out of range");
  return std::strtoull(value.c_str(), nullptr, 10);
}

Status parseVariable(const std::string& flag, const std::string& value, std::map<std::string, std::string>& out) {
  auto eq = value.find('=');
  std::string name = value.substr(0, eq);
  bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!valid) return usageError(flag + ": '" + name + "' is not a valid variable name");
  if (eq == std::string::npos) {
    const char* host = std::getenv(name.c_str());
    if (host == nullptr) return usageError(flag + ": " + name + " is not set on the host");
    out[name] = host;
  } else {
    out[name] = value.substr(eq + 1);
  }
  return {};
}

Status parseLabel(const std::string& flag, const std::string& value, std::map<std::string, std::string>& out) {
  auto eq = value.find('=');
  if (eq == std::string::npos || eq == 0) return usageError(flag + ": expected KEY=VALUE, got '" + value + "'");
  out[value.substr(0, eq)] = value.substr(eq + 1);
  return {};
}

Result<nlohmann::json> parsePermissionsFlag(const std::string& flag, const std::string& value) {
  std::string text = value;
  if (!value.empty() && value[0] == '@') {
    auto file = os::readFile(value.substr(1), 1u << 20);
    if (!file.ok()) return usageError(flag + ": " + file.error().message());
    text = file.value();
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object())
    return usageError(flag + ": expected a JSON object (or @FILE), e.g. '{\"run_command\": \"ask\"}'");
  return j;
}

Result<std::string> environmentPath(const std::string& id) {
  // moatd decodes the path before splitting it, so an encoded '/' would
  // still name another endpoint.
  if (id.empty() || id.find('/') != std::string::npos) {
    return usageError("'" + id + "' is not an environment id");
  }
  return "/v1/environments/" + urlEncode(id);
}

bool writeAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

int complain(int code, const std::string& message) {
  std::fprintf(stderr, "moat: %s\n", message.c_str());
  return code;
}

int reportFailure(const std::string& command, const Error& error) {
  if (error.code == Code::kUsage) {
    std::fprintf(stderr, "moat %s: %s\n", command.c_str(), error.message().c_str());
    return kExitUsage;
  }
  return complain(kExitEnvironment, error.message());
}

const char* connectionUsage() {
  return R"(connection (every client command):
  --url URL         moatd's address: http://HOST:PORT or unix:/path/to.sock
                    (default $MOAT_URL, else unix:<state>/moatd.sock)
  --token T         API token (default $MOAT_TOKEN, else <state>/master-token)
  --state DIR       state directory (default $MOAT_STATE or /var/lib/moat)
)";
}

}  // namespace moat::cli
