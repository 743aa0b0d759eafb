// An environment's network: its egress link plugged in, changed, or put
// back after a restart or a restore (docs/EGRESS.md); the files and
// variables that go with it.
#include <arpa/inet.h>

#include "manager/environment_manager.h"
#include "manager/stored_settings.h"

namespace moat::manager {

void EnvironmentManager::dropNetworkVariables(const std::string& id) {
  live_.update(id, [](LiveEnvironment& live) {
    for (auto& [k, v] : egress::Controller::environmentVariables(egress::EgressNetwork::linkFor(0))) live.env.erase(k);
  });
}

Status EnvironmentManager::restoreNetwork(const std::string& id, const std::string& why) {
  MOAT_ASSIGN(auto record, get(id));
  MOAT_ASSIGN(egress::Policy policy, storedNetwork(record));
  if (policy.mode == egress::Mode::kNone) {
    MOAT_TRY(store_.setNetwork(id, networkText(policy), -1));
    dropNetworkVariables(id);
    return {};
  }
  auto secrets = storedSecrets(record);
  MOAT_TRY(connectNetwork(id, policy, secrets.ok() ? secrets.value() : std::vector<egress::Secret>{}));
  audit_.record("network.changed", id, "moatd", {{"network", policy.toJson()}, {"reason", why}});
  return {};
}

Status EnvironmentManager::writeNetworkFiles(const std::shared_ptr<InitConnection>& connection,
                                             const egress::EgressNetwork::Link& link) {
  auto write = [&](const std::string& path, const std::string& data) -> Status {
    init::FileRequest w;
    w.op = init::FileOp::kWrite;
    w.path = path;
    w.data = data;
    w.mode = 0644;
    w.flags = init::kFileCreateParents;
    MOAT_ASSIGN(init::FileResult r, connection->file(w));
    if (r.err != 0) return Error::fromErrno("write " + path + " in the environment", r.err);
    return {};
  };
  const std::string& ca = egress_->caCertificatePem();
  // The environment's own bundle plus moatd's CA, for programs that only
  // read the system's (and for the variables that name ours).
  std::string bundle;
  init::FileRequest read;
  read.op = init::FileOp::kRead;
  read.path = "/etc/ssl/certs/ca-certificates.crt";
  read.length = 4 << 20;
  auto existing = connection->file(read);
  bool haveSystemBundle = existing.ok() && existing->err == 0;
  if (haveSystemBundle) bundle = existing->data;
  // Written again by every link (a resume from disk, a restore): ours once.
  // A bundle as long as the read may go on past it: not written back cut.
  const bool whole = bundle.size() < read.length;
  const bool ours = bundle.find(ca) != std::string::npos;
  if (!ours) {
    if (!bundle.empty() && bundle.back() != '\n') bundle += '\n';
    bundle += ca;
  }
  MOAT_TRY(write(egress::Controller::kCaPath, ca));
  MOAT_TRY(write(egress::Controller::kCaBundlePath, whole ? bundle : ca));  // never a PEM cut in the middle
  if (haveSystemBundle && whole && !ours) MOAT_TRY(write(read.path, bundle));
  std::string gateway = egress::formatIpv4(ntohl(link.gateway));
  MOAT_TRY(write("/etc/resolv.conf", "# moat: names are answered by moatd's resolver (docs/EGRESS.md)\nnameserver " +
                                         gateway + "\noptions timeout:2 attempts:2\n"));
  return {};
}

Status EnvironmentManager::connectNetwork(const std::string& id, const egress::Policy& policy,
                                          const std::vector<egress::Secret>& secrets) {
  if (!egress_) return Error::make(Code::kUnavailable, "egress control is not running in this moatd");
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  MOAT_ASSIGN(UniqueFd netns, backend_.networkNamespace(id));
  MOAT_ASSIGN(auto link, egress_->attach(id, netns.get(), policy, secrets));
  Status s = writeNetworkFiles(live.connection, link);
  if (s.ok()) s = store_.setNetwork(id, networkText(policy), link.slot);
  if (!s.ok()) {
    (void)egress_->detach(id);
    return s;
  }
  live_.update(id, [&](LiveEnvironment& live) {
    for (auto& [k, v] : egress::Controller::environmentVariables(link)) live.env[k] = v;
  });
  return {};
}

Status EnvironmentManager::connectNetworkUnlessSet(const std::string& id, const egress::Policy& policy,
                                                   const std::vector<egress::Secret>& secrets) {
  std::lock_guard<std::mutex> serial(networkMutex_);
  // A PUT .../network that came between "running" and here has put its
  // policy in force: it is the later word.
  if (egress_ && egress_->slotOf(id)) return {};
  return connectNetwork(id, policy, secrets);
}

Result<UniqueFd> EnvironmentManager::connectToPort(const std::string& id, uint16_t port,
                                                   std::chrono::milliseconds timeout) {
  MOAT_ASSIGN(LiveEnvironment live, liveOf(id));
  // Its servers are stopped: a connection would wait for nothing. (Said
  // without the id: a preview's visitor may be anyone.)
  if (live.paused)
    return Error::make(Code::kUnavailable, "the environment is paused: its servers answer after a resume");
  return backend_.connectPort(id, port, timeout);
}

Result<egress::Policy> EnvironmentManager::network(const std::string& id) {
  MOAT_ASSIGN(auto record, get(id));
  return storedNetwork(record);
}

Status EnvironmentManager::setNetwork(const std::string& id, const egress::Policy& policy) {
  std::lock_guard<std::mutex> serial(networkMutex_);
  // A first link writes /etc/resolv.conf and the proxy's CA inside: a
  // paused environment's files do not change.
  MOAT_TRY(unpausedLiveOf(id, "change its network"));
  if (!egress_) {
    if (policy.mode == egress::Mode::kNone) return {};
    return Error::make(Code::kUnavailable,
                       "egress control is not running in this moatd: only mode \"none\" is available");
  }
  bool linked = egress_->slotOf(id).has_value();
  if (policy.mode == egress::Mode::kNone) {
    if (linked) MOAT_TRY(egress_->detach(id));
    MOAT_TRY(store_.setNetwork(id, networkText(policy), -1));
    dropNetworkVariables(id);
    return {};
  }
  if (linked) {
    MOAT_TRY(egress_->setPolicy(id, policy));
    return store_.setNetwork(id, networkText(policy), *egress_->slotOf(id));
  }
  MOAT_ASSIGN(auto record, get(id));
  auto secrets = storedSecrets(record);
  return connectNetwork(id, policy, secrets.ok() ? secrets.value() : std::vector<egress::Secret>{});
}

}  // namespace moat::manager
