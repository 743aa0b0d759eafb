#include "egress/controller.h"

#include <arpa/inet.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "egress/controller_internal.h"
#include "egress/dns_message.h"
#include "os/netlink.h"

namespace moat::egress {

Result<std::unique_ptr<Controller>> Controller::start(EgressConfig config, audit::Recorder& audit, GateHook gate,
                                                      GateProbe asks) {
  std::unique_ptr<Controller> c(new Controller);
  c->config_ = std::move(config);
  c->audit_ = &audit;
  c->gate_ = std::move(gate);
  c->asks_ = std::move(asks);
  MOAT_ASSIGN(c->resolver_, Resolver::load(c->config_.hostsFile));
  MOAT_ASSIGN(c->authority_, TlsAuthority::loadOrCreate(c->config_.stateDir + "/egress"));
  MOAT_ASSIGN(c->upstreamTls_, TlsAuthority::upstreamContext(c->config_.upstreamCaBundle));
  MOAT_ASSIGN(c->network_, EgressNetwork::openOrCreate(c->config_.stateDir));
  const std::pair<uint16_t, Entry> ports[] = {{kProxyPort, Entry::kForward}, {80, Entry::kHttp}, {443, Entry::kTls}};
  for (const auto& [port, entry] : ports) {
    MOAT_ASSIGN(UniqueFd fd, c->network_->listenTcp(port));
    int raw = fd.get();
    c->listeners_.push_back(std::move(fd));
    Entry e = entry;
    Controller* self = c.get();
    c->threads_.emplace_back([self, raw, e] { self->acceptLoop(raw, e); });
  }
  MOAT_ASSIGN(c->dns_, c->network_->bindUdp(53));
  Controller* self = c.get();
  c->threads_.emplace_back([self] { self->dnsLoop(); });
  return c;
}

Controller::~Controller() { stop(); }

void Controller::stop() {
  if (stopping_.exchange(true)) return;
  for (auto& l : listeners_) ::shutdown(l.get(), SHUT_RDWR);
  {
    std::unique_lock<std::mutex> lock(connectionsMutex_);
    for (int fd : openFds_) ::shutdown(fd, SHUT_RDWR);
    connectionsCv_.wait_for(lock, std::chrono::seconds(10), [this] { return running_ == 0; });
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
}

std::map<std::string, std::string> Controller::environmentVariables(const EgressNetwork::Link& link) {
  std::string proxy = "http://" + formatIpv4(ntohl(link.gateway)) + ":" + std::to_string(kProxyPort);
  return {{"HTTP_PROXY", proxy},
          {"HTTPS_PROXY", proxy},
          {"http_proxy", proxy},
          {"https_proxy", proxy},
          {"NO_PROXY", "localhost,127.0.0.1,::1"},
          {"no_proxy", "localhost,127.0.0.1,::1"},
          {"SSL_CERT_FILE", kCaBundlePath},
          {"REQUESTS_CA_BUNDLE", kCaBundlePath},
          {"CURL_CA_BUNDLE", kCaBundlePath},
          {"NODE_EXTRA_CA_CERTS", kCaPath}};
}

Result<EgressNetwork::Link> Controller::attach(const std::string& environment, int netnsFd, Policy policy,
                                               std::vector<Secret> secrets) {
  uint32_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (byId_.count(environment))
      return Error::make(Code::kConflict, "environment " + environment + " is already attached");
    while (bySlot_.count(slot)) ++slot;
    auto env = std::make_shared<Env>();
    env->id = environment;
    env->link = EgressNetwork::linkFor(slot);
    env->policy = std::make_shared<const Policy>(std::move(policy));
    env->secrets = std::make_shared<const std::vector<Secret>>(std::move(secrets));
    env->attaching = true;
    byId_[environment] = env;
    bySlot_[slot] = env;
  }
  auto link = network_->attach(netnsFd, slot);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!link.ok()) {
    byId_.erase(environment);
    bySlot_.erase(slot);
    return link.error();
  }
  byId_[environment]->attaching = false;
  return link;
}

void Controller::adopt(const std::string& environment, uint32_t slot, Policy policy, std::vector<Secret> secrets) {
  auto env = std::make_shared<Env>();
  env->id = environment;
  env->link = EgressNetwork::linkFor(slot);
  env->policy = std::make_shared<const Policy>(std::move(policy));
  env->secrets = std::make_shared<const std::vector<Secret>>(std::move(secrets));
  std::lock_guard<std::mutex> lock(mutex_);
  byId_[environment] = env;
  bySlot_[slot] = env;
}

Status Controller::setPolicy(const std::string& environment, Policy policy) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = byId_.find(environment);
  if (it == byId_.end()) return Error::make(Code::kNotFound, "environment " + environment + " has no egress link");
  std::lock_guard<std::mutex> envLock(it->second->mutex);
  it->second->policy = std::make_shared<const Policy>(std::move(policy));
  return {};
}

Status Controller::detach(const std::string& environment) {
  // A reading of the counters (networkCounters) sees the link or what it
  // carried, never neither nor both: it waits for the whole detach.
  std::lock_guard<std::mutex> counting(countersMutex_);
  std::shared_ptr<Env> env;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = byId_.find(environment);
    if (it == byId_.end()) return {};
    env = it->second;
    byId_.erase(it);
    bySlot_.erase(env->link.slot);
  }
  auto carried = network_->counters(env->link.slot);
  Status detached = network_->detach(env->link.slot);
  // (Counters that could not be read before the link went are lost with it.)
  if (carried.ok() && detached.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    detachedCounters_[environment] += carried.value();
  }
  return detached;
}

void Controller::forget(const std::string& environment) {
  std::lock_guard<std::mutex> lock(mutex_);
  detachedCounters_.erase(environment);
  auto it = byId_.find(environment);
  if (it == byId_.end()) return;
  bySlot_.erase(it->second->link.slot);
  byId_.erase(it);
}

std::optional<uint32_t> Controller::slotOf(const std::string& environment) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = byId_.find(environment);
  if (it == byId_.end()) return std::nullopt;
  return it->second->link.slot;
}

Result<os::LinkCounters> Controller::networkCounters(const std::string& environment) {
  std::lock_guard<std::mutex> counting(countersMutex_);
  os::LinkCounters total;
  std::optional<uint32_t> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = detachedCounters_.find(environment); it != detachedCounters_.end()) total = it->second;
    if (auto it = byId_.find(environment); it != byId_.end() && !it->second->attaching) slot = it->second->link.slot;
  }
  if (!slot) return total;
  MOAT_ASSIGN(os::LinkCounters now, network_->counters(*slot));
  return total += now;
}

Status Controller::removeNamespace() { return network_->remove(); }

Result<std::set<uint32_t>> Controller::presentSlots() const {
  MOAT_ASSIGN(auto slots, network_->linkedSlots());
  return std::set<uint32_t>(slots.begin(), slots.end());
}

size_t Controller::removeUnadoptedLinks() {
  auto slots = network_->linkedSlots();
  if (!slots.ok()) return 0;
  size_t removed = 0;
  for (uint32_t slot : slots.value()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bySlot_.count(slot)) continue;
    }
    // Deleting this end takes the environment's end (eth0) with it.
    if (network_->detach(slot).ok()) ++removed;
  }
  return removed;
}

std::shared_ptr<Controller::Env> Controller::envByAddress(uint32_t address) {
  auto slot = EgressNetwork::slotOf(htonl(address));
  if (!slot.ok()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = bySlot_.find(slot.value());
  if (it == bySlot_.end() || it->second->attaching || ntohl(it->second->link.address) != address) return nullptr;
  return it->second;
}

void Controller::record(const std::shared_ptr<Env>& env, bool allowed, nlohmann::json data) {
  // Refusals cost the environment nothing to provoke (a UDP packet, a
  // connection), allowed requests one round trip each to a host it may
  // reach: either, unbounded, would fill the audit log and the disk under
  // it. At a bounded pace each, within the environment's share of the log,
  // the rest counted (audit::EnvironmentShare).
  audit_->recordByEnvironment(
      allowed ? "egress.allowed" : "egress.denied", env->id, std::move(data),
      allowed ? audit::Pace{kAllowedEventRate, kAllowedEventBurst} : audit::Pace{kDeniedEventRate, kDeniedEventBurst});
}

void Controller::acceptLoop(int listenFd, Entry entry) {
  while (!stopping_) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 50);  // out of descriptors: let some close
        continue;
      }
      return;  // shut down
    }
    serve(UniqueFd(fd), entry);
  }
}

void Controller::serve(UniqueFd client, Entry entry) {
  int tracker;
  {
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    if (stopping_ || running_ >= kMaxThreads) return;  // closes the client
    // A duplicate keeps the number taken while the connection lives, so a
    // shutdown at stop reaches this socket and no other.
    tracker = ::dup(client.get());
    if (tracker < 0) return;
    openFds_.insert(tracker);
    ++running_;
  }
  std::thread([this, c = client.release(), entry, tracker]() mutable {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    UniqueFd fd(c);
    if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
      auto env = envByAddress(ntohl(peer.sin_addr.s_addr));
      if (env) serveConnection(env, std::move(fd), entry);
    }
    fd.reset();
    std::lock_guard<std::mutex> lock(connectionsMutex_);
    openFds_.erase(tracker);
    ::close(tracker);
    --running_;
    connectionsCv_.notify_all();
  }).detach();
}

void Controller::dnsLoop() {
  while (!stopping_) {
    struct pollfd p {
      dns_.get(), POLLIN, 0
    };
    if (::poll(&p, 1, 250) <= 0) continue;
    char buf[4096];
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = ::recvfrom(dns_.get(), buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) continue;
    auto env = envByAddress(ntohl(from.sin_addr.s_addr));
    if (!env) continue;
    {
      // Beyond its rate or its resolutions at once, an environment's
      // questions go unanswered (its resolver asks again): a flood neither
      // takes moatd's threads from others nor fills the audit log.
      std::lock_guard<std::mutex> lock(env->mutex);
      if (!env->dnsQuestions.take(kDnsRate, kDnsBurst) || env->dnsInFlight.load() >= kDnsInFlight) {
        continue;
      }
    }
    std::string packet(buf, static_cast<size_t>(n));
    {
      std::lock_guard<std::mutex> lock(connectionsMutex_);
      if (running_ >= kMaxThreads) continue;
      ++running_;
    }
    ++env->dnsInFlight;  // only this thread adds: the check above holds
    // Resolution may wait on the host's resolver: one thread per question.
    std::thread([this, env, packet = std::move(packet), from]() mutable {
      answerDns(env, std::move(packet), from);
      --env->dnsInFlight;
      std::lock_guard<std::mutex> lock(connectionsMutex_);
      --running_;
      connectionsCv_.notify_all();
    }).detach();
  }
}

void Controller::answerDns(std::shared_ptr<Env> env, std::string packet, sockaddr_in from) {
  auto send = [&](const std::string& reply) {
    ::sendto(dns_.get(), reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&from),
             sizeof from);
  };
  auto query = parseDnsQuery(packet);
  if (!query.ok()) {
    if (auto formerr = dnsFormatErrorFor(packet)) send(*formerr);
    return;
  }
  const DnsQuery& q = query.value();
  constexpr uint16_t kA = kDnsTypeA;
  auto refuse = [&](const std::string& rule, const std::string& why) {
    record(env, false, {{"via", "dns"}, {"host", q.name}, {"qtype", q.type}, {"rule", rule}, {"reason", why}});
    send(dnsError(q, kDnsRefused));
  };
  std::shared_ptr<const Policy> policy = env->currentPolicy();
  Verdict v = decide(*policy, Destination{q.name, 0, std::nullopt, "", ""});
  if (v.outcome == Outcome::kDeny) return refuse(v.rule, "denied by the network policy");
  // Listed (or open mode): the ceiling of the key that created the
  // environment still decides whether the name goes upstream at all.
  const bool listed = v.outcome != Outcome::kUnlisted;
  GateProbeAnswer probe =
      asks_ ? asks_(env->id, q.name, listed) : (listed ? GateProbeAnswer::kAllow : GateProbeAnswer::kDeny);
  if (probe == GateProbeAnswer::kAsk) {
    // Nothing goes upstream before a person says yes: a stand-in address
    // that the proxy maps back to the name when the connection comes.
    if (q.type != kA) return send(dnsAnswer(q, {}, 5));
    uint32_t standIn;
    {
      std::lock_guard<std::mutex> lock(env->mutex);
      if (auto it = env->standInByName.find(q.name); it != env->standInByName.end()) {
        standIn = it->second;
      } else {
        standIn = kStandInBase + (env->nextStandIn++ % kStandInsPerEnvironment);
        if (auto old = env->nameByStandIn.find(standIn); old != env->nameByStandIn.end()) {
          env->standInByName.erase(old->second);
        }
        env->standInByName[q.name] = standIn;
        env->nameByStandIn[standIn] = q.name;
      }
    }
    return send(dnsAnswer(q, {htonl(standIn)}, 5));
  }
  if (!listed) return refuse(v.rule, "not on the allowlist");
  if (probe == GateProbeAnswer::kDeny) {
    return refuse("ceiling", "the ceiling of the API key that created the environment denies it");
  }
  if (q.type != kA) return send(dnsAnswer(q, {}, 60));  // no IPv6 inside: an empty answer
  auto addresses = resolver_.resolve(q.name);
  if (!addresses.ok()) {
    record(env, false, {{"via", "dns"}, {"host", q.name}, {"rule", v.rule}, {"reason", addresses.error().message()}});
    return send(dnsError(q, kDnsNxDomain));
  }
  std::vector<uint32_t> answer;
  std::string refusedBy;
  for (uint32_t a : addresses.value()) {
    Destination withA{q.name, 0, a, "", ""};
    withA.hostLocal = !isSpecialAddress(a) && hostLocal(a);
    Verdict withAddress = decide(*policy, withA);
    if (withAddress.outcome == Outcome::kDeny)
      refusedBy = withAddress.rule;
    else
      answer.push_back(htonl(a));
  }
  if (answer.empty()) return refuse(refusedBy, q.name + " resolves only to addresses the policy refuses");
  send(dnsAnswer(q, answer, 60));
}

std::optional<std::string> Controller::standInName(const std::shared_ptr<Env>& env, uint32_t address) {
  std::lock_guard<std::mutex> lock(env->mutex);
  auto it = env->nameByStandIn.find(address);
  if (it == env->nameByStandIn.end()) return std::nullopt;
  return it->second;
}

bool Controller::hostLocal(uint32_t address) {
  if (resolver_.pinned(address)) return false;
  // This thread is in moatd's own network namespace, where upstream
  // connections start: a local route there means a service of the host.
  auto netlink = os::Netlink::open();
  if (!netlink.ok()) return true;
  auto type = netlink->routeType(htonl(address));
  return type.ok() && type.value() == RTN_LOCAL;
}

}  // namespace moat::egress
