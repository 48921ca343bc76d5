"""A Chinese team's ordinary FAQ pays off from its first request (issue #62): six questions of
eight phrasings each with the team's answers, loaded with `strata intents load` into the shipped
`faq` policy, in front of the real CPU model. Other wordings of its questions are served the
team's answers on probation; questions of none of its intents never are."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ROOT
from tests.support import ask, eventually, run_cli, serve_strata, strata_settings

pytestmark = pytest.mark.e2e

CATEGORY = "zh_shop"
# The team's file: what a support team writes down (6 questions x 8 phrasings, its own answers).
FAQ: list[dict[str, Any]] = [
    {"intent": "return_goods", "answer": "收到商品7天内可在“我的订单”中点击“申请售后-退货”，填写原因后按提示寄回商品。",
     "phrasings": ["怎么退货", "我想退货", "退货流程是什么", "买的东西不想要了怎么退", "商品怎么退回去", "退货怎么操作",
                   "收到的东西能退吗", "申请退货在哪里"]},
    {"intent": "refund", "answer": "退款会原路退回，银行卡一般3到5个工作日到账，余额支付当天到账。",
     "phrasings": ["怎么退款", "退款多久能到", "钱什么时候退给我", "申请退款怎么弄", "退款怎么还没到", "我要退钱",
                   "退款去哪里申请", "退的钱到哪了"]},
    {"intent": "invoice", "answer": "订单完成后在“订单详情-申请发票”中填写抬头和税号，电子发票会发到您的邮箱。",
     "phrasings": ["怎么开发票", "我要开发票", "发票在哪里申请", "能开增值税发票吗", "电子发票怎么获取", "发票抬头怎么填",
                   "可以补开发票吗", "开票怎么操作"]},
    {"intent": "password", "answer": "在登录页点击“忘记密码”，用绑定的手机号接收验证码后即可重设密码。",
     "phrasings": ["忘记密码怎么办", "密码忘了", "怎么重置密码", "登录密码找不回来了", "密码想不起来了", "怎么修改密码",
                   "重设登录密码", "密码错误登不上去"]},
    {"intent": "shipping_time", "answer": "现货订单48小时内发货，发货后一般2到4天送达，偏远地区5到7天。",
     "phrasings": ["多久发货", "什么时候能收到货", "快递要几天", "几天能送到", "下单后多久到", "物流一般多长时间",
                   "什么时候发货", "货多久能到"]},
    {"intent": "change_address", "answer": "订单发货前可在“订单详情-修改地址”中更改收货地址，发货后请联系快递改派。",
     "phrasings": ["怎么改收货地址", "地址填错了怎么办", "收货地址可以修改吗", "我想换个收货地址", "下单后还能改地址吗",
                   "修改配送地址", "送货地址写错了", "更改收件地址"]},
]
ANSWER = {item["intent"]: item["answer"] for item in FAQ}
# Other wordings than the file's (the four misses, and the seed's own pair: the file
# says 怎么退货 is a return, so 怎么申请退换货 gets the return's answer), a question asked both
# ways (能不能: no negation) of an intent whose phrasings never negate, and questions naming an
# amount or a day the team's phrasings do not (its answer depends on neither).
PARAPHRASES = {"退款多久到账": "refund", "我忘了密码": "password", "快递几天能到": "shipping_time",
               "收货地址能改吗": "change_address", "怎么申请退换货": "return_goods", "收货地址能不能改": "change_address",
               "退款100元多久到账": "refund", "明天能收到货吗": "shipping_time"}
OUT_OF_SCOPE = ("你们几点下班", "推荐一款手机", "今天天气怎么样")


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, redis_url: str, vllm: tuple[str, str],
         use_encoder: Any) -> Iterator[tuple[str, dict[str, str], str]]:
    """(Strata's URL, the CLI's environment, the model) with the shipped policy plus a category
    of the shipped faq's settings for this test's own records."""
    folder = tmp_path_factory.mktemp("zh-faq")
    policy = yaml.safe_load((ROOT / "schemas" / "policy.yaml").read_text(encoding="utf-8"))
    policy["categories"][CATEGORY] = {"like": "faq"}
    policy_file = folder / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy, allow_unicode=True), encoding="utf-8")
    url, model = vllm
    settings = strata_settings(redis_url, url, semantic_enabled=True, upstream_timeout_s=120.0,
                               default_max_tokens=48, policy_file=str(policy_file))
    with serve_strata(settings, use_encoder) as server:
        yield server.url, {"STRATA_REDIS_URL": redis_url, "STRATA_POLICY_FILE": str(policy_file)}, model


def test_a_chinese_faq_serves_its_answers_to_other_wordings_and_none_to_other_questions(
        shop: tuple[str, dict[str, str], str], tmp_path: Path) -> None:
    base, env, model = shop
    team = tmp_path / "team.yaml"
    team.write_text(yaml.safe_dump(FAQ, allow_unicode=True), encoding="utf-8")
    loaded = run_cli("intents", "load", str(team), "--category", CATEGORY, env=env)
    assert loaded.returncode == 0, (loaded.stdout, loaded.stderr)
    said = loaded.stdout.strip().splitlines()[-1]
    # Chinese out-of-scope stand-ins were added, and the rule serves on probation from the first request.
    assert "out-of-scope questions of Strata's" in said and "on probation from the first request" in said, said
    # "退款怎么还没到", "买的东西不想要了怎么退", "密码想不起来了": negation does not tell those three
    # intents' questions apart, and the intent rule may serve past the negation guard there.
    assert "The team's own phrasings of 3 intents differ in negation" in said, said
    assert eventually(lambda: [h for h in httpx.get(base + "/health").json().get("intents", [])
                               if h["category"] == CATEGORY], timeout=15)
    headers = {"X-Cache-Category": CATEGORY}
    # The CPU model answers a miss in seconds, more on a busy machine.
    client = httpx.Client(base_url=base, timeout=120)
    for question, intent in PARAPHRASES.items():
        reply = ask(client, question, headers=headers, model=model)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-cache"] == "semantic-hit" and reply.headers["x-cache-verdict"] == "intent_probation", \
            (question, dict(reply.headers))
        assert reply.json()["choices"][0]["message"]["content"] == ANSWER[intent], question
    # Questions of none of its intents: the model answers, never a team's answer.
    for question in OUT_OF_SCOPE:
        reply = ask(client, question, headers=headers, model=model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] not in ANSWER.values(), question
    # The seed's twins: an invoice is never given the refund's answer.
    invoice = ask(client, "怎么开发票", headers=headers, model=model).json()["choices"][0]["message"]["content"]
    assert invoice == ANSWER["invoice"] and invoice != ANSWER["refund"]
    assert run_cli("intents", "remove", "--category", CATEGORY, env=env).returncode == 0
