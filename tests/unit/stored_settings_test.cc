// An environment's settings in its store record: what a record without
// them means, the round trip, and text no moatd wrote.
#include "manager/stored_settings.h"

#include <gtest/gtest.h>

namespace moat::manager {
namespace {

using nlohmann::json;

TEST(StoredSettings, ARecordWithoutSettingsHasTheDefaultsNoNetworkAndNoSecrets) {
  store::EnvironmentRecord r;
  auto layers = storedLayers(r, gate::Permissions::allowAll());
  ASSERT_TRUE(layers.ok());
  ASSERT_EQ(layers->size(), 1u);
  EXPECT_EQ(layers->front().toJson(), gate::Permissions::allowAll().toJson());
  auto network = storedNetwork(r);
  ASSERT_TRUE(network.ok());
  EXPECT_EQ(network->mode, egress::Mode::kNone);
  auto secrets = storedSecrets(r);
  ASSERT_TRUE(secrets.ok());
  EXPECT_TRUE(secrets->empty());
}

TEST(StoredSettings, WhatIsWrittenIsReadBackTheSame) {
  auto tight =
      gate::Permissions::parse(json{{"run_command", "ask"}, {"network", "deny"}}, gate::Permissions::defaults());
  ASSERT_TRUE(tight.ok());
  const std::vector<gate::Permissions> layers = {gate::Permissions::defaults(), tight.value()};
  auto policy = egress::Policy::parse(json{{"allow", {"pypi.org:443", "10.1.0.0/16"}}, {"max_connections", 8}});
  ASSERT_TRUE(policy.ok());
  egress::Secret secret{"TOKEN", "s3cret", {"api.github.com"}, "Authorization", "Bearer {value}", "moat-secret-x"};

  store::EnvironmentRecord r;
  r.permissions = layersText(layers);
  r.network = networkText(policy.value());
  r.secrets = secretsText({secret});
  auto backLayers = storedLayers(r, gate::Permissions::allowAll());
  ASSERT_TRUE(backLayers.ok());
  ASSERT_EQ(backLayers->size(), 2u);
  EXPECT_EQ(backLayers->at(1).toJson(), tight->toJson());
  auto backNetwork = storedNetwork(r);
  ASSERT_TRUE(backNetwork.ok());
  EXPECT_EQ(backNetwork->toJson(), policy->toJson());
  EXPECT_EQ(backNetwork->maxConnections, 8u);
  auto backSecrets = storedSecrets(r);
  ASSERT_TRUE(backSecrets.ok());
  ASSERT_EQ(backSecrets->size(), 1u);
  EXPECT_EQ(backSecrets->at(0).value, "s3cret");
  EXPECT_EQ(backSecrets->at(0).hosts, std::vector<std::string>{"api.github.com"});
  EXPECT_EQ(backSecrets->at(0).placeholder, "moat-secret-x");
}

// Text no moatd wrote (a hand edit, a newer moatd): an error, never a
// default that would loosen what the environment may do.
TEST(StoredSettings, TextThatCannotBeReadIsAnErrorNotADefault) {
  store::EnvironmentRecord r;
  r.id = "abcdefabcdef";
  r.permissions = R"({"run_command": "allow"})";  // not an array of layers
  r.network = "{not json";
  r.secrets = "7";
  EXPECT_FALSE(storedLayers(r, gate::Permissions::allowAll()).ok());
  auto network = storedNetwork(r);
  ASSERT_FALSE(network.ok());
  EXPECT_EQ(network.error().code, Code::kCorrupt);
  EXPECT_NE(network.error().message().find("abcdefabcdef"), std::string::npos) << network.error().message();
  EXPECT_FALSE(storedSecrets(r).ok());
  r.network = R"({"mode": "sometimes"})";
  EXPECT_FALSE(storedNetwork(r).ok());
}

}  // namespace
}  // namespace moat::manager
