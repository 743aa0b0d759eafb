#pragma once

#include <netinet/in.h>
#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "audit/event.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "egress/authorize.h"
#include "egress/channel.h"
#include "egress/network.h"
#include "egress/policy.h"
#include "egress/resolver.h"
#include "egress/secrets.h"
#include "egress/tls_authority.h"

// Egress control (docs/EGRESS.md): every environment with network access
// has a veth into moatd's egress namespace, where this controller's proxy
// (HTTP forward proxy on 3128, transparent HTTP on 80 and HTTPS on 443) and
// resolver (UDP 53) are the only things listening. Each connection is
// decided by the environment's policy, then the gate, and recorded.
//
// Tested in two layers: what it decides is pure and unit-tested without
// root (authorize.h: policy, then the gate; policy.h, http_target.h,
// client_hello.h, dns_message.h, secrets.h, public_suffix.h); this class is
// the sockets, threads and the namespace around those decisions, and is
// tested as moatd runs it (tests/egress: end to end and abuse, as root in
// namespaces the tests make). A fake network under it would test the fake.
namespace moat::egress {

struct EgressConfig {
  std::string stateDir;
  std::string upstreamCaBundle;  // empty: the system's
  std::string hostsFile;         // empty: none (see Resolver)
  std::chrono::milliseconds idleTimeout{std::chrono::minutes(5)};
  // A request head (or a TLS ClientHello and handshake) must arrive whole
  // within this, however slowly it trickles.
  std::chrono::milliseconds headTimeout{std::chrono::seconds(30)};
  std::chrono::milliseconds connectTimeout{std::chrono::seconds(10)};
};

constexpr uint16_t kProxyPort = 3128;

// What that question would get, without waiting for anyone, for the
// resolver: deny (refused), ask (a stand-in address: nothing goes upstream
// before the decision) or allow (resolved).
enum class GateProbeAnswer { kAllow, kAsk, kDeny };
using GateProbe = std::function<GateProbeAnswer(const std::string& environment, const std::string& host, bool listed)>;

class Controller {
 public:
  static Result<std::unique_ptr<Controller>> start(EgressConfig config, audit::Recorder& audit, GateHook gate,
                                                   GateProbe asks);
  ~Controller();  // stop()s; the namespace and its links stay (a restart adopts them)
  // Stops serving: listeners close and every open connection ends. Idempotent.
  void stop();

  // Plugs an environment in (a new link in a free slot) with its policy and
  // secrets; returns the link. Failure leaves nothing behind.
  Result<EgressNetwork::Link> attach(const std::string& environment, int netnsFd, Policy policy,
                                     std::vector<Secret> secrets);
  // After a moatd restart: the link is still there, only moatd forgot it.
  void adopt(const std::string& environment, uint32_t slot, Policy policy, std::vector<Secret> secrets);
  // New connections follow the new policy; open ones finish as they were.
  Status setPolicy(const std::string& environment, Policy policy);
  // Removes the environment's link (its mode became "none").
  Status detach(const std::string& environment);
  // The environment is gone (its namespace took the link with it).
  void forget(const std::string& environment);
  std::optional<uint32_t> slotOf(const std::string& environment);
  // The bytes the environment has sent and received over its links, as
  // their veths count them (every packet: proxied, resolved, refused): its
  // link now since it was made (one adopted after a restart included), plus
  // what links detached by this moatd carried. Zero for one never linked.
  Result<os::LinkCounters> networkCounters(const std::string& environment);
  // After a moatd restart: the slots whose link is in the egress namespace
  // now, and the removal of every link no adopted environment holds (an
  // attach that a killed moatd did not live to record); best effort, it
  // returns how many went.
  Result<std::set<uint32_t>> presentSlots() const;
  size_t removeUnadoptedLinks();
  // moatd's orderly stop: nothing is left of the egress namespace.
  Status removeNamespace();

  const std::string& caCertificatePem() const { return authority_->caCertificatePem(); }
  // What every command of a networked environment gets: proxy variables and
  // the CA bundle paths (files written by the manager, see kCaBundlePath).
  static std::map<std::string, std::string> environmentVariables(const EgressNetwork::Link& link);
  static constexpr const char* kCaPath = "/etc/moat/ca.crt";
  static constexpr const char* kCaBundlePath = "/etc/moat/ca-bundle.crt";

 private:
  struct Env;
  enum class Entry { kForward, kHttp, kTls };
  Controller() = default;

  std::shared_ptr<Env> envByAddress(uint32_t address);
  void acceptLoop(int listenFd, Entry entry);
  void dnsLoop();
  void answerDns(std::shared_ptr<Env> env, std::string packet, struct sockaddr_in from);
  void serve(UniqueFd client, Entry entry);
  void serveConnection(const std::shared_ptr<Env>& env, UniqueFd client, Entry entry);
  Decision authorize(const std::shared_ptr<Env>& env, const std::string& host, uint16_t port, const std::string& method,
                     const std::string& path);
  Result<UniqueFd> connectUpstream(uint32_t address, uint16_t port);
  std::optional<std::string> standInName(const std::shared_ptr<Env>& env, uint32_t address);
  // `address` is one of moatd's host's own (a route of type local) and no
  // --egress-hosts line names it. Fails closed.
  bool hostLocal(uint32_t address);
  static constexpr size_t kMaxThreads = 4096;
  static constexpr uint32_t kStandInBase = 0xC6120000;  // 198.18.0.0/15 (benchmarking: never real)
  static constexpr uint32_t kStandInsPerEnvironment = 4096;
  // Per environment: DNS questions a second (and saved up), resolutions at
  // once, refusals and allowed connections or requests recorded a second
  // (and saved up).
  static constexpr double kDnsRate = 200, kDnsBurst = 400;
  static constexpr uint32_t kDnsInFlight = 32;
  static constexpr double kDeniedEventRate = 50, kDeniedEventBurst = 200;
  static constexpr double kAllowedEventRate = 200, kAllowedEventBurst = 1000;
  void record(const std::shared_ptr<Env>& env, bool allowed, nlohmann::json data);
  void handleForward(const std::shared_ptr<Env>& env, UniqueFd client);
  // TLS from the client: passed through as it is, or (secrets, request
  // rules) intercepted with moatd's certificate and handled as HTTP.
  void tlsTunnel(const std::shared_ptr<Env>& env, UniqueFd client, std::string buffered, const std::string& requested,
                 uint16_t port, uint32_t destination, const std::string& via, const Decision* decided);
  void handleHttp(const std::shared_ptr<Env>& env, Channel& client, const std::string& fixedHost, uint16_t fixedPort,
                  std::unique_ptr<Channel> upstream, Decision decided, const std::string& via);
  void throttle(const std::shared_ptr<Env>& env, size_t bytes);
  // Records a refused request (event["reason"] = why unless it has one) and
  // answers it with `status` and why, then lingers (lingerAfterAnswer).
  void refuse(const std::shared_ptr<Env>& env, Channel& client, int status, const char* statusText,
              nlohmann::json event, const std::string& why);
  // Why a connection got 408: its request head did not arrive in time.
  std::string headTimedOut() const;

  EgressConfig config_;
  audit::Recorder* audit_ = nullptr;
  GateHook gate_;
  GateProbe asks_;
  std::unique_ptr<EgressNetwork> network_;
  std::unique_ptr<TlsAuthority> authority_;
  std::shared_ptr<SSL_CTX> upstreamTls_;
  Resolver resolver_;

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Env>> byId_;
  std::map<uint32_t, std::shared_ptr<Env>> bySlot_;
  // What the links of environments that went to mode "none" carried before
  // they went (a later link's counters start at 0): until forget().
  std::map<std::string, os::LinkCounters> detachedCounters_;
  std::mutex countersMutex_;  // held by detach() and networkCounters(), outside mutex_

  std::vector<UniqueFd> listeners_;
  UniqueFd dns_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::mutex connectionsMutex_;
  std::condition_variable connectionsCv_;
  std::set<int> openFds_;  // shut down on stop so that every connection thread ends
  size_t running_ = 0;
};

}  // namespace moat::egress
